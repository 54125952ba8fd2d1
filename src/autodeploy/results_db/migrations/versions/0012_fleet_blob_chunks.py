"""Fleet blobs in chunks, and retention (issue 51): a blob's bytes move from ``ad_fleet_blobs.data`` (one
bytea row: a 14 MB model, a 41 MB data set in one INSERT, read whole) to ``ad_fleet_blob_chunks`` (``sha256``,
``seq``, ``data``; 4 MiB each, written and read one at a time); ``ad_fleet_blobs`` keeps the blob's one row
(digest, size, created_at) and gains ``pruned_at``, set when ``fleet prune`` removes a winner bundle's chunks.

Blobs stored before this revision are split into chunks here, in the database (``substr`` on the stored
value: its bytes never pass through this process), so an old database reads as a new one. A downgrade joins
them again; a pruned blob has no bytes left and comes back empty (it then fails its SHA-256 check, as a
damaged one does).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: ``fleet/ledger.py`` ``BLOB_CHUNK_BYTES`` at this revision (a migration keeps its own copy: it outlives the code).
CHUNK_BYTES = 4 * 2**20

blobs = sa.table("ad_fleet_blobs", sa.column("sha256", sa.String), sa.column("data", sa.LargeBinary))
chunks = sa.table("ad_fleet_blob_chunks", sa.column("sha256", sa.String), sa.column("seq", sa.Integer),
                  sa.column("data", sa.LargeBinary))  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "ad_fleet_blob_chunks",
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["sha256"], ["ad_fleet_blobs.sha256"],
                                name=op.f("fk_ad_fleet_blob_chunks_sha256_ad_fleet_blobs")),  # fmt: skip
        sa.PrimaryKeyConstraint("sha256", "seq", name=op.f("pk_ad_fleet_blob_chunks")),
    )
    conn = op.get_bind()
    for digest, size in conn.execute(sa.select(blobs.c.sha256, sa.func.length(blobs.c.data))).all():
        for seq in range(-(-int(size) // CHUNK_BYTES)):  # an empty blob has no chunk
            part = sa.func.substr(blobs.c.data, seq * CHUNK_BYTES + 1, CHUNK_BYTES)
            piece = sa.select(blobs.c.sha256, sa.literal(seq, sa.Integer), part).where(blobs.c.sha256 == digest)
            conn.execute(chunks.insert().from_select(["sha256", "seq", "data"], piece))
    with op.batch_alter_table("ad_fleet_blobs") as batch:
        batch.drop_column("data")
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_fleet_blobs") as batch:
        batch.drop_column("pruned_at")
        batch.add_column(sa.Column("data", sa.LargeBinary(), nullable=True))
    conn = op.get_bind()
    for (digest,) in conn.execute(sa.select(blobs.c.sha256)).all():
        pieces = conn.execute(sa.select(chunks.c.data).where(chunks.c.sha256 == digest).order_by(chunks.c.seq))
        joined = b"".join(bytes(p) for (p,) in pieces)
        conn.execute(blobs.update().where(blobs.c.sha256 == digest).values(data=joined))
    with op.batch_alter_table("ad_fleet_blobs") as batch:
        batch.alter_column("data", existing_type=sa.LargeBinary(), nullable=False)
    op.drop_table("ad_fleet_blob_chunks")
