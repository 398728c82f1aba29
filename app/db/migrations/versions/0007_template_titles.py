"""what customers see of a template: its title in the topic picker and the questions an empty chat suggests

Revision ID: 0007
Revises: 0006
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('templates') as batch_op:
        batch_op.add_column(sa.Column('title', sa.String(length=200), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('examples', sa.Text(), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('templates') as batch_op:
        batch_op.drop_column('examples')
        batch_op.drop_column('title')
