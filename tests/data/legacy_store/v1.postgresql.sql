
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TABLE public.flm_jobs (
    id integer NOT NULL,
    sweep_id integer NOT NULL,
    job_key character varying(200) NOT NULL,
    layout_id integer,
    script_path text,
    executor character varying(16),
    scheduler_job_id character varying(64),
    array_index integer,
    state character varying(32) NOT NULL,
    reason text,
    exit_code character varying(32),
    nodes text,
    submitted_at timestamp with time zone,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    attempts integer NOT NULL,
    run_id character varying(128),
    updated_at timestamp with time zone
);

CREATE SEQUENCE public.flm_jobs_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.flm_jobs_id_seq OWNED BY public.flm_jobs.id;

CREATE TABLE public.flm_layouts (
    id integer NOT NULL,
    layout_hash character varying(16) NOT NULL,
    model_name character varying(200) NOT NULL,
    system_name character varying(200) NOT NULL,
    tp integer NOT NULL,
    pp integer NOT NULL,
    dp integer NOT NULL,
    micro_batch integer NOT NULL,
    global_batch integer NOT NULL,
    schedule character varying(32) NOT NULL,
    virtual_stages integer NOT NULL,
    sequence_parallel boolean NOT NULL,
    recompute character varying(32) NOT NULL,
    flash_attention boolean NOT NULL,
    dtype character varying(16) NOT NULL,
    sharding character varying(200) NOT NULL,
    zero_stage integer,
    model_json text NOT NULL,
    layout_json text NOT NULL
);

CREATE SEQUENCE public.flm_layouts_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.flm_layouts_id_seq OWNED BY public.flm_layouts.id;

CREATE TABLE public.flm_meta (
    key character varying(64) NOT NULL,
    value text NOT NULL
);

CREATE TABLE public.flm_predictions (
    id integer NOT NULL,
    layout_id integer NOT NULL,
    costmodel_version character varying(64) NOT NULL,
    step_time_s double precision,
    model_tflops_per_gpu double precision,
    hardware_tflops_per_gpu double precision,
    mfu double precision,
    peak_memory_bytes bigint,
    fits boolean,
    breakdown_json text
);

CREATE SEQUENCE public.flm_predictions_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.flm_predictions_id_seq OWNED BY public.flm_predictions.id;

CREATE TABLE public.flm_rank_memory (
    run integer NOT NULL,
    rank integer NOT NULL,
    pp_stage integer NOT NULL,
    tp_rank integer NOT NULL,
    dp_rank integer NOT NULL,
    params_bytes bigint,
    grads_bytes bigint,
    optimizer_bytes bigint,
    activations_peak_bytes bigint,
    device_allocated_peak_bytes bigint,
    device_reserved_peak_bytes bigint,
    host_rss_peak_bytes bigint
);

CREATE TABLE public.flm_runs (
    id integer NOT NULL,
    run_id character varying(128) NOT NULL,
    layout_id integer NOT NULL,
    sweep_name character varying(200),
    job_key character varying(200),
    status character varying(16) NOT NULL,
    error text,
    engine character varying(64) NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    world_size integer NOT NULL,
    steps_measured integer NOT NULL,
    step_time_s double precision,
    tokens_per_s double precision,
    model_tflops_per_gpu double precision,
    hardware_tflops_per_gpu double precision,
    mfu double precision,
    hfu double precision,
    peak_memory_bytes bigint,
    costmodel_version character varying(64),
    trace_path text NOT NULL,
    trace_digest character varying(64) NOT NULL,
    labels_json text NOT NULL,
    environment_json text NOT NULL
);

CREATE SEQUENCE public.flm_runs_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.flm_runs_id_seq OWNED BY public.flm_runs.id;

CREATE TABLE public.flm_steps (
    run integer NOT NULL,
    step integer NOT NULL,
    time_s double precision NOT NULL,
    loss double precision,
    warmup boolean NOT NULL
);

CREATE TABLE public.flm_sweeps (
    id integer NOT NULL,
    name character varying(200) NOT NULL,
    spec_yaml text,
    directory text,
    created_at timestamp with time zone
);

CREATE SEQUENCE public.flm_sweeps_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.flm_sweeps_id_seq OWNED BY public.flm_sweeps.id;

ALTER TABLE ONLY public.flm_jobs ALTER COLUMN id SET DEFAULT nextval('public.flm_jobs_id_seq'::regclass);

ALTER TABLE ONLY public.flm_layouts ALTER COLUMN id SET DEFAULT nextval('public.flm_layouts_id_seq'::regclass);

ALTER TABLE ONLY public.flm_predictions ALTER COLUMN id SET DEFAULT nextval('public.flm_predictions_id_seq'::regclass);

ALTER TABLE ONLY public.flm_runs ALTER COLUMN id SET DEFAULT nextval('public.flm_runs_id_seq'::regclass);

ALTER TABLE ONLY public.flm_sweeps ALTER COLUMN id SET DEFAULT nextval('public.flm_sweeps_id_seq'::regclass);

INSERT INTO public.flm_meta VALUES ('schema_version', '1');

SELECT pg_catalog.setval('public.flm_jobs_id_seq', 1, false);

SELECT pg_catalog.setval('public.flm_layouts_id_seq', 1, false);

SELECT pg_catalog.setval('public.flm_predictions_id_seq', 1, false);

SELECT pg_catalog.setval('public.flm_runs_id_seq', 1, false);

SELECT pg_catalog.setval('public.flm_sweeps_id_seq', 1, false);

ALTER TABLE ONLY public.flm_jobs
    ADD CONSTRAINT flm_jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flm_layouts
    ADD CONSTRAINT flm_layouts_layout_hash_key UNIQUE (layout_hash);

ALTER TABLE ONLY public.flm_layouts
    ADD CONSTRAINT flm_layouts_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flm_meta
    ADD CONSTRAINT flm_meta_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.flm_predictions
    ADD CONSTRAINT flm_predictions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flm_rank_memory
    ADD CONSTRAINT flm_rank_memory_pkey PRIMARY KEY (run, rank);

ALTER TABLE ONLY public.flm_runs
    ADD CONSTRAINT flm_runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flm_runs
    ADD CONSTRAINT flm_runs_run_id_key UNIQUE (run_id);

ALTER TABLE ONLY public.flm_steps
    ADD CONSTRAINT flm_steps_pkey PRIMARY KEY (run, step);

ALTER TABLE ONLY public.flm_sweeps
    ADD CONSTRAINT flm_sweeps_name_key UNIQUE (name);

ALTER TABLE ONLY public.flm_sweeps
    ADD CONSTRAINT flm_sweeps_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flm_jobs
    ADD CONSTRAINT uq_flm_jobs_sweep_key UNIQUE (sweep_id, job_key);

ALTER TABLE ONLY public.flm_predictions
    ADD CONSTRAINT uq_flm_predictions_layout_version UNIQUE (layout_id, costmodel_version);

ALTER TABLE ONLY public.flm_jobs
    ADD CONSTRAINT flm_jobs_layout_id_fkey FOREIGN KEY (layout_id) REFERENCES public.flm_layouts(id);

ALTER TABLE ONLY public.flm_jobs
    ADD CONSTRAINT flm_jobs_sweep_id_fkey FOREIGN KEY (sweep_id) REFERENCES public.flm_sweeps(id) ON DELETE CASCADE;

ALTER TABLE ONLY public.flm_predictions
    ADD CONSTRAINT flm_predictions_layout_id_fkey FOREIGN KEY (layout_id) REFERENCES public.flm_layouts(id);

ALTER TABLE ONLY public.flm_rank_memory
    ADD CONSTRAINT flm_rank_memory_run_fkey FOREIGN KEY (run) REFERENCES public.flm_runs(id) ON DELETE CASCADE;

ALTER TABLE ONLY public.flm_runs
    ADD CONSTRAINT flm_runs_layout_id_fkey FOREIGN KEY (layout_id) REFERENCES public.flm_layouts(id);

ALTER TABLE ONLY public.flm_steps
    ADD CONSTRAINT flm_steps_run_fkey FOREIGN KEY (run) REFERENCES public.flm_runs(id) ON DELETE CASCADE;

