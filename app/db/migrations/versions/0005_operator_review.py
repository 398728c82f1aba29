"""the operator's review: when a live split started, the customers' own hit rate in the samples, and
the indexes the conversation list, version table and hit-rate window filter by

Revision ID: 0005
Revises: 0004
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

INDEXES = (
    ('ix_conversations_template_id', 'conversations', ['template_id']),
    ('ix_conversations_template_version_id', 'conversations', ['template_version_id']),
    ('ix_conversations_handoff', 'conversations', ['handoff']),
    ('ix_conversations_tenant', 'conversations', ['tenant']),
    ('ix_messages_template_version_id', 'messages', ['template_version_id']),
    ('ix_messages_finished_at', 'messages', ['finished_at']),
)


def upgrade() -> None:
    with op.batch_alter_table('templates') as batch_op:
        batch_op.add_column(sa.Column('candidate_since', sa.DateTime(), nullable=True))
    with op.batch_alter_table('cache_samples') as batch_op:
        batch_op.add_column(sa.Column('customer_hit_rate', sa.Float(), nullable=True))
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table)
    with op.batch_alter_table('cache_samples') as batch_op:
        batch_op.drop_column('customer_hit_rate')
    with op.batch_alter_table('templates') as batch_op:
        batch_op.drop_column('candidate_since')
