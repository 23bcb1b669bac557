"""Create the flm_ tables (schema version 1).

Written out as they were at version 1, not taken from ``schema.py``: a revision must build the
same tables whatever ``schema.py`` says later. Databases made by the hand-written migrations
before Alembic (frontier_llm <= 0.x, ``flm_meta.schema_version`` = 1) are stamped at this
revision instead of running it (see ``migrate.py``).
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('flm_layouts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('layout_hash', sa.String(length=16), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=False),
    sa.Column('system_name', sa.String(length=200), nullable=False),
    sa.Column('tp', sa.Integer(), nullable=False),
    sa.Column('pp', sa.Integer(), nullable=False),
    sa.Column('dp', sa.Integer(), nullable=False),
    sa.Column('micro_batch', sa.Integer(), nullable=False),
    sa.Column('global_batch', sa.Integer(), nullable=False),
    sa.Column('schedule', sa.String(length=32), nullable=False),
    sa.Column('virtual_stages', sa.Integer(), nullable=False),
    sa.Column('sequence_parallel', sa.Boolean(), nullable=False),
    sa.Column('recompute', sa.String(length=32), nullable=False),
    sa.Column('flash_attention', sa.Boolean(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('sharding', sa.String(length=200), nullable=False),
    sa.Column('zero_stage', sa.Integer(), nullable=True),
    sa.Column('model_json', sa.Text(), nullable=False),
    sa.Column('layout_json', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('layout_hash')
    )
    op.create_table('flm_meta',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('flm_sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('spec_yaml', sa.Text(), nullable=True),
    sa.Column('directory', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('flm_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('job_key', sa.String(length=200), nullable=False),
    sa.Column('layout_id', sa.Integer(), nullable=True),
    sa.Column('script_path', sa.Text(), nullable=True),
    sa.Column('executor', sa.String(length=16), nullable=True),
    sa.Column('scheduler_job_id', sa.String(length=64), nullable=True),
    sa.Column('array_index', sa.Integer(), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('exit_code', sa.String(length=32), nullable=True),
    sa.Column('nodes', sa.Text(), nullable=True),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['layout_id'], ['flm_layouts.id'], ),
    sa.ForeignKeyConstraint(['sweep_id'], ['flm_sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_id', 'job_key', name='uq_flm_jobs_sweep_key')
    )
    op.create_table('flm_predictions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('layout_id', sa.Integer(), nullable=False),
    sa.Column('costmodel_version', sa.String(length=64), nullable=False),
    sa.Column('step_time_s', sa.Float(), nullable=True),
    sa.Column('model_tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('hardware_tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('mfu', sa.Float(), nullable=True),
    sa.Column('peak_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('fits', sa.Boolean(), nullable=True),
    sa.Column('breakdown_json', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['layout_id'], ['flm_layouts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('layout_id', 'costmodel_version', name='uq_flm_predictions_layout_version')
    )
    op.create_table('flm_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('layout_id', sa.Integer(), nullable=False),
    sa.Column('sweep_name', sa.String(length=200), nullable=True),
    sa.Column('job_key', sa.String(length=200), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('engine', sa.String(length=64), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('steps_measured', sa.Integer(), nullable=False),
    sa.Column('step_time_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('model_tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('hardware_tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('mfu', sa.Float(), nullable=True),
    sa.Column('hfu', sa.Float(), nullable=True),
    sa.Column('peak_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('costmodel_version', sa.String(length=64), nullable=True),
    sa.Column('trace_path', sa.Text(), nullable=False),
    sa.Column('trace_digest', sa.String(length=64), nullable=False),
    sa.Column('labels_json', sa.Text(), nullable=False),
    sa.Column('environment_json', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['layout_id'], ['flm_layouts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id')
    )
    op.create_table('flm_rank_memory',
    sa.Column('run', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('pp_stage', sa.Integer(), nullable=False),
    sa.Column('tp_rank', sa.Integer(), nullable=False),
    sa.Column('dp_rank', sa.Integer(), nullable=False),
    sa.Column('params_bytes', sa.BigInteger(), nullable=True),
    sa.Column('grads_bytes', sa.BigInteger(), nullable=True),
    sa.Column('optimizer_bytes', sa.BigInteger(), nullable=True),
    sa.Column('activations_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('device_allocated_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('device_reserved_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('host_rss_peak_bytes', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['run'], ['flm_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run', 'rank')
    )
    op.create_table('flm_steps',
    sa.Column('run', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('time_s', sa.Float(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('warmup', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['run'], ['flm_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run', 'step')
    )

    op.bulk_insert(sa.table("flm_meta", sa.column("key", sa.String), sa.column("value", sa.Text)),
                   [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    # frontier_llm never downgrades: an older frontier_llm refuses a newer database instead.
    raise NotImplementedError
