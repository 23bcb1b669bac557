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
INSERT INTO "flm_layouts" VALUES(1,'b31608f6749af791','tiny-gpt','cpu-local',2,1,1,1,2,'1f1b',1,0,'none',1,'fp32','zero0',0,'{"activation":"gelu","ffn_hidden":256,"heads":4,"hidden":64,"kv_heads":4,"layers":4,"name":"tiny-gpt","seq_len":32,"vocab":256}','{"dp":1,"dtype":"fp32","flash_attention":true,"global_batch":2,"micro_batch":1,"pp":1,"recompute":"none","schedule":"1f1b","sequence_parallel":false,"sharding":{"grads":"replicate","optim":"replicate","params":"replicate"},"tp":2,"virtual_stages":1,"zero_stage":0}');
CREATE TABLE flm_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "flm_meta" VALUES('schema_version','2');
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
INSERT INTO "flm_predictions" VALUES(1,1,'test-1',6.59384000000000081165e-02,6.83925603290343729102e-04,6.83925603290343729102e-04,0.01,3464475,1,'{"breakdown":{"memory":{"activations":2000000.0,"params":469760},"time":{"bubble_s":0.0,"compute_s":0.060000000000000005}},"costmodel_version":"test-1","fits":true,"hardware_tflops_per_gpu":0.0006839256032903437,"hfu":0.01,"mfu":0.01,"model_tflops_per_gpu":0.0006839256032903437,"peak_memory_bytes":3464475,"step_time_s":0.06593840000000001,"tokens_per_s":970.6028657049609}');
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
INSERT INTO "flm_rank_memory" VALUES(1,0,0,0,0,469760,469760,939520,1970377,3849417,4897993,400000000);
INSERT INTO "flm_rank_memory" VALUES(1,1,0,1,0,469760,469760,939520,1960486,3839526,4888102,400000001);
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
INSERT INTO "flm_runs" VALUES(1,'legacy-run',1,NULL,NULL,'completed',NULL,'native','2025-01-02 03:04:05.000000','2025-01-02 03:05:05.000000',2,2,0.059944,1.06766315227545715064e+03,7.52318163619378112855e-04,7.52318163619378112855e-04,7.52318163619378112855e-04,7.52318163619378112855e-04,3849417,'test-1','/tmp/9b/legacy/traces/legacy-run.trace.json','a16830ae82434c0cd46b79f4a6b5c76f8ea8c9d03ede532c5f646ff2530fa415','{}','{"backend":"gloo","device":"cpu","hostnames":["node001"],"launcher":"local","slurm_job_id":null,"versions":{"python":"3.11.7","torch":"2.13.0"},"world_size":2}');
CREATE TABLE flm_steps (
	run INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	time_s FLOAT NOT NULL, 
	loss FLOAT, 
	warmup BOOLEAN NOT NULL, 
	PRIMARY KEY (run, step), 
	FOREIGN KEY(run) REFERENCES flm_runs (id) ON DELETE CASCADE
);
INSERT INTO "flm_steps" VALUES(1,0,0.066373,5.51393,1);
INSERT INTO "flm_steps" VALUES(1,1,0.059944,5.38815,0);
INSERT INTO "flm_steps" VALUES(1,2,0.05916,5.28879,0);
CREATE TABLE flm_sweeps (
	id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	spec_yaml TEXT, 
	directory TEXT, 
	created_at DATETIME, 
	PRIMARY KEY (id), 
	UNIQUE (name)
);
CREATE INDEX ix_flm_runs_sweep_name ON flm_runs (sweep_name);
CREATE INDEX ix_flm_runs_layout_id ON flm_runs (layout_id);
CREATE INDEX ix_flm_jobs_state ON flm_jobs (state);
COMMIT;
