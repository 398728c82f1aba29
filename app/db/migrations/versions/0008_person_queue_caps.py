"""the person queue's caps: which client asked for a person, and how many requests each cap refused an hour

Revision ID: 0008
Revises: 0007
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversations') as batch_op:
        batch_op.add_column(sa.Column('handoff_client', sa.String(length=64), nullable=False, server_default=''))
    op.create_table(
        'person_refusals',
        sa.Column('hour', sa.DateTime(), nullable=False),
        sa.Column('cap', sa.String(length=16), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('hour', 'cap'),
    )


def downgrade() -> None:
    op.drop_table('person_refusals')
    with op.batch_alter_table('conversations') as batch_op:
        batch_op.drop_column('handoff_client')
