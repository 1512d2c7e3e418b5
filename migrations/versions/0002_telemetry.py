"""telemetry windows: per-run, per-GPU roll-ups of DCGM samples

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import adapters.sql.tables


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = adapters.sql.tables.UTCDateTime(timezone=True)
    op.create_table('telemetry_windows',
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('gpu_key', sa.String(length=400), nullable=False),
    sa.Column('window_start', utc, nullable=False),
    sa.Column('window_seconds', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=63), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('gpu_uuid', sa.String(length=80), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('mig_profile', sa.String(length=20), nullable=True),
    sa.Column('mig_instance', sa.Integer(), nullable=True),
    sa.Column('pod', sa.String(length=253), nullable=True),
    sa.Column('namespace', sa.String(length=63), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('first_sample_at', utc, nullable=False),
    sa.Column('last_sample_at', utc, nullable=False),
    sa.Column('sm_active_n', sa.Integer(), nullable=False),
    sa.Column('sm_active_sum', sa.Float(), nullable=False),
    sa.Column('sm_active_max', sa.Float(), nullable=False),
    sa.Column('gr_engine_n', sa.Integer(), nullable=False),
    sa.Column('gr_engine_sum', sa.Float(), nullable=False),
    sa.Column('gr_engine_max', sa.Float(), nullable=False),
    sa.Column('gpu_util_n', sa.Integer(), nullable=False),
    sa.Column('gpu_util_sum', sa.Float(), nullable=False),
    sa.Column('gpu_util_max', sa.Float(), nullable=False),
    sa.Column('tensor_n', sa.Integer(), nullable=False),
    sa.Column('tensor_sum', sa.Float(), nullable=False),
    sa.Column('fb_used_n', sa.Integer(), nullable=False),
    sa.Column('fb_used_sum', sa.Float(), nullable=False),
    sa.Column('fb_free_n', sa.Integer(), nullable=False),
    sa.Column('fb_free_sum', sa.Float(), nullable=False),
    sa.Column('power_n', sa.Integer(), nullable=False),
    sa.Column('power_sum', sa.Float(), nullable=False),
    sa.Column('xid_last', sa.Integer(), nullable=True),
    sa.Column('xid_at', utc, nullable=True),
    sa.Column('xid_error_samples', sa.Integer(), nullable=False),
    sa.Column('updated_at', utc, nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'gpu_key', 'window_start', name=op.f('pk_telemetry_windows'))
    )
    op.create_index('ix_telemetry_windows_window_start', 'telemetry_windows', ['window_start'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_telemetry_windows_window_start', table_name='telemetry_windows')
    op.drop_table('telemetry_windows')
