"""ratings, hand-off to a person, a conversation's own version and live splits, finish reasons, options

Revision ID: 0004
Revises: 0003
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('ratings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('message_id', sa.Integer(), nullable=False),
    sa.Column('conversation_id', sa.Integer(), nullable=False),
    sa.Column('template_version_id', sa.Integer(), nullable=True),
    sa.Column('thumbs', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], ),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ),
    sa.ForeignKeyConstraint(['template_version_id'], ['template_versions.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('message_id')
    )
    op.create_index('ix_ratings_conversation_id', 'ratings', ['conversation_id'])
    op.create_index('ix_ratings_template_version_id', 'ratings', ['template_version_id'])
    op.create_table('options',
    sa.Column('name', sa.String(length=50), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('updated_by', sa.String(length=100), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    with op.batch_alter_table('templates') as batch_op:
        batch_op.add_column(sa.Column('candidate_version_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('candidate_share', sa.Float(), nullable=False, server_default='0'))
        batch_op.create_foreign_key('fk_templates_candidate_version', 'template_versions', ['candidate_version_id'],
                                    ['id'], use_alter=True)
    with op.batch_alter_table('conversations') as batch_op:
        batch_op.add_column(sa.Column('template_version_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('handoff', sa.String(length=16), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('handoff_requested_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('handoff_operator', sa.String(length=100), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('deleted_at', sa.DateTime(), nullable=True))
        batch_op.create_foreign_key('fk_conversations_template_version', 'template_versions',
                                    ['template_version_id'], ['id'])
    with op.batch_alter_table('messages') as batch_op:
        batch_op.add_column(sa.Column('finish_reason', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('author', sa.String(length=100), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('first_visible_ms', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages') as batch_op:
        batch_op.drop_column('first_visible_ms')
        batch_op.drop_column('author')
        batch_op.drop_column('finish_reason')
    with op.batch_alter_table('conversations') as batch_op:
        batch_op.drop_constraint('fk_conversations_template_version', type_='foreignkey')
        batch_op.drop_column('deleted_at')
        batch_op.drop_column('handoff_operator')
        batch_op.drop_column('handoff_requested_at')
        batch_op.drop_column('handoff')
        batch_op.drop_column('template_version_id')
    with op.batch_alter_table('templates') as batch_op:
        batch_op.drop_constraint('fk_templates_candidate_version', type_='foreignkey')
        batch_op.drop_column('candidate_share')
        batch_op.drop_column('candidate_version_id')
    op.drop_table('options')
    op.drop_index('ix_ratings_template_version_id', 'ratings')
    op.drop_index('ix_ratings_conversation_id', 'ratings')
    op.drop_table('ratings')
