"""console sessions, leases, revisions, internal templates, audit field, answer replica

Revision ID: 0003
Revises: 0002
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_sessions',
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('operator', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.Column('revoked_at', sa.DateTime(), nullable=True),
    sa.Column('client', sa.String(length=100), nullable=False),
    sa.PrimaryKeyConstraint('token_hash')
    )
    op.create_table('leases',
    sa.Column('name', sa.String(length=50), nullable=False),
    sa.Column('holder', sa.String(length=100), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('revisions',
    sa.Column('name', sa.String(length=50), nullable=False),
    sa.Column('value', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    with op.batch_alter_table('templates') as batch_op:
        batch_op.add_column(sa.Column('internal', sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table('messages') as batch_op:
        batch_op.add_column(sa.Column('replica', sa.String(length=200), nullable=True))
    with op.batch_alter_table('audit') as batch_op:
        batch_op.add_column(sa.Column('field', sa.String(length=50), nullable=False, server_default=''))
    with op.batch_alter_table('cache_samples') as batch_op:
        batch_op.alter_column('hit_rate', new_column_name='recent_hit_rate')
        # GPU and process memory passes 2 GiB, the limit of a 32-bit integer column (PostgreSQL).
        batch_op.alter_column('memory_bytes', type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    with op.batch_alter_table('cache_samples') as batch_op:
        batch_op.alter_column('memory_bytes', type_=sa.Integer(), existing_type=sa.BigInteger())
        batch_op.alter_column('recent_hit_rate', new_column_name='hit_rate')
    with op.batch_alter_table('audit') as batch_op:
        batch_op.drop_column('field')
    with op.batch_alter_table('messages') as batch_op:
        batch_op.drop_column('replica')
    with op.batch_alter_table('templates') as batch_op:
        batch_op.drop_column('internal')
    op.drop_table('revisions')
    op.drop_table('leases')
    op.drop_table('admin_sessions')
