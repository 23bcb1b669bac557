BEGIN TRANSACTION;
CREATE TABLE flm_jobs (
	id INTEGER NOT NULL, 
	sweep_id INTEGER NOT NULL, 
	job_key VARCHAR(200) NOT NULL, 
	layout_id INTEGER, 
	script_path TEXT, 
	executor VARCHAR(16), 
	scheduler_job_id VARCHAR(64), 
	array_index INTEGER, 
	state VARCHAR(32) NOT NULL, 
	reason TEXT, 
	exit_code VARCHAR(32), 
	nodes TEXT, 
	submitted_at DATETIME, 
	started_at DATETIME, 
	finished_at DATETIME, 
	attempts INTEGER NOT NULL, 
	run_id VARCHAR(128), 
	updated_at DATETIME, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_flm_jobs_sweep_key UNIQUE (sweep_id, job_key), 
	FOREIGN KEY(sweep_id) REFERENCES flm_sweeps (id) ON DELETE CASCADE, 
	FOREIGN KEY(layout_id) REFERENCES flm_layouts (id)
);
CREATE TABLE flm_layouts (
	id INTEGER NOT NULL, 
	layout_hash VARCHAR(16) NOT NULL, 
	model_name VARCHAR(200) NOT NULL, 
	system_name VARCHAR(200) NOT NULL, 
	tp INTEGER NOT NULL, 
	pp INTEGER NOT NULL, 
	dp INTEGER NOT NULL, 
	micro_batch INTEGER NOT NULL, 
	global_batch INTEGER NOT NULL, 
	schedule VARCHAR(32) NOT NULL, 
	virtual_stages INTEGER NOT NULL, 
	sequence_parallel BOOLEAN NOT NULL, 
	recompute VARCHAR(32) NOT NULL, 
	flash_attention BOOLEAN NOT NULL, 
	dtype VARCHAR(16) NOT NULL, 
	sharding VARCHAR(200) NOT NULL, 
	zero_stage INTEGER, 
	model_json TEXT NOT NULL, 
	layout_json TEXT NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (layout_hash)
);
CREATE TABLE flm_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "flm_meta" VALUES('schema_version','1');
CREATE TABLE flm_predictions (
	id INTEGER NOT NULL, 
	layout_id INTEGER NOT NULL, 
	costmodel_version VARCHAR(64) NOT NULL, 
	step_time_s FLOAT, 
	model_tflops_per_gpu FLOAT, 
	hardware_tflops_per_gpu FLOAT, 
	mfu FLOAT, 
	peak_memory_bytes BIGINT, 
	fits BOOLEAN, 
	breakdown_json TEXT, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_flm_predictions_layout_version UNIQUE (layout_id, costmodel_version), 
	FOREIGN KEY(layout_id) REFERENCES flm_layouts (id)
);
CREATE TABLE flm_rank_memory (
	run INTEGER NOT NULL, 
	rank INTEGER NOT NULL, 
	pp_stage INTEGER NOT NULL, 
	tp_rank INTEGER NOT NULL, 
	dp_rank INTEGER NOT NULL, 
	params_bytes BIGINT, 
	grads_bytes BIGINT, 
	optimizer_bytes BIGINT, 
	activations_peak_bytes BIGINT, 
	device_allocated_peak_bytes BIGINT, 
	device_reserved_peak_bytes BIGINT, 
	host_rss_peak_bytes BIGINT, 
	PRIMARY KEY (run, rank), 
	FOREIGN KEY(run) REFERENCES flm_runs (id) ON DELETE CASCADE
);
CREATE TABLE flm_runs (
	id INTEGER NOT NULL, 
	run_id VARCHAR(128) NOT NULL, 
	layout_id INTEGER NOT NULL, 
	sweep_name VARCHAR(200), 
	job_key VARCHAR(200), 
	status VARCHAR(16) NOT NULL, 
	error TEXT, 
	engine VARCHAR(64) NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	world_size INTEGER NOT NULL, 
	steps_measured INTEGER NOT NULL, 
	step_time_s FLOAT, 
	tokens_per_s FLOAT, 
	model_tflops_per_gpu FLOAT, 
	hardware_tflops_per_gpu FLOAT, 
	mfu FLOAT, 
	hfu FLOAT, 
	peak_memory_bytes BIGINT, 
	costmodel_version VARCHAR(64), 
	trace_path TEXT NOT NULL, 
	trace_digest VARCHAR(64) NOT NULL, 
	labels_json TEXT NOT NULL, 
	environment_json TEXT NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (run_id), 
	FOREIGN KEY(layout_id) REFERENCES flm_layouts (id)
);
CREATE TABLE flm_steps (
	run INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	time_s FLOAT NOT NULL, 
	loss FLOAT, 
	warmup BOOLEAN NOT NULL, 
	PRIMARY KEY (run, step), 
	FOREIGN KEY(run) REFERENCES flm_runs (id) ON DELETE CASCADE
);
CREATE TABLE flm_sweeps (
	id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	spec_yaml TEXT, 
	directory TEXT, 
	created_at DATETIME, 
	PRIMARY KEY (id), 
	UNIQUE (name)
);
COMMIT;
