"""runs.lent_to: the waiting gang whose reserved capacity a run borrowed

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 19:00:00.000000

While a reservation waits for running work to end, the capacity it holds is lent to preemptible
gangs; the gang it is held for takes it back (end cause `taken-back`). The run keeps the id of
that gang so the scheduler knows, cycle after cycle, what may be taken back and by whom. No
foreign key: the owner may be admitted, cancelled or gone, and the mark then means nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lent_to", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lent_to")
