"""cloud clusters: locators, Kubernetes settings and sync state on clusters; bounds and scaling on pools

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10 10:00:00.000000

Only locators and settings: no credential, token or kubeconfig is ever stored here (a user kubeconfig
lives in a 0600 file in the state dir; `kubeconfig_ref` is its file name).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import adapters.sql.tables


revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLUSTER_COLUMNS = (
    "account",
    "cloud_cluster",
    "resource_group",
    "cloud_cluster_id",
    "kube_settings",
    "kubeconfig_ref",
    "sync_state",
    "sync_error",
    "synced_at",
    "pool_issues",
    "pool_prices",
)
POOL_COLUMNS = (
    "min_size",
    "max_size",
    "instance_type",
    "cloud_pool_id",
    "scale_target",
    "scale_requested_at",
    "idle_since",
)


def upgrade() -> None:
    utc = adapters.sql.tables.UTCDateTime(timezone=True)
    empty_object = sa.text("'{}'")
    empty_list = sa.text("'[]'")
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("account", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("cloud_cluster", sa.String(length=253), nullable=False, server_default=""))
        batch.add_column(sa.Column("resource_group", sa.String(length=90), nullable=False, server_default=""))
        batch.add_column(sa.Column("cloud_cluster_id", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("kube_settings", sa.JSON(), nullable=False, server_default=empty_object))
        batch.add_column(sa.Column("kubeconfig_ref", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("sync_state", sa.String(length=20), nullable=False, server_default="ready"))
        batch.add_column(sa.Column("sync_error", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("synced_at", utc, nullable=True))
        batch.add_column(sa.Column("pool_issues", sa.JSON(), nullable=False, server_default=empty_list))
        batch.add_column(sa.Column("pool_prices", sa.JSON(), nullable=False, server_default=empty_object))
    with op.batch_alter_table("node_pools") as batch:
        batch.add_column(sa.Column("min_size", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("max_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("instance_type", sa.String(length=80), nullable=False, server_default=""))
        batch.add_column(sa.Column("cloud_pool_id", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("scale_target", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("scale_requested_at", utc, nullable=True))
        batch.add_column(sa.Column("idle_since", utc, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node_pools") as batch:
        for name in reversed(POOL_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("clusters") as batch:
        for name in reversed(CLUSTER_COLUMNS):
            batch.drop_column(name)
