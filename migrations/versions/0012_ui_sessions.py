"""ui sessions: the dashboard's server-side logins, stored as the SHA-256 of the cookie's secret

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 09:00:00.000000

Until now the dashboard's cookie held the API token itself. A session row ties a random secret
(only its hash is kept) to the token it was opened with and an expiry; deleting the token deletes
its sessions.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from adapters.sql.tables import UTCDateTime

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = UTCDateTime(timezone=True)
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.Column("expires_at", utc, nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    op.create_index("ix_ui_sessions_token_id", "ui_sessions", ["token_id"], unique=False)
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_index("ix_ui_sessions_token_id", table_name="ui_sessions")
    op.drop_table("ui_sessions")
