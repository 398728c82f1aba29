"""The database layer on SQLite and on PostgreSQL: the same migrations, queries and rules on both.

PostgreSQL runs when PREFIXDESK_TEST_POSTGRES_URL names a server where the user may create databases
(.ci/run starts Debian's PostgreSQL and sets it); each test gets a database of its own.
"""

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import inspect, text

from app import template_files
from app.core.catalog import TemplateCatalog
from app.core.desk import Finished
from app.db import Database
from app.db import audit as db_audit
from app.db import conversations as db_conversations
from app.db import leases as db_leases
from app.db import metrics as db_metrics
from app.db import operators as db_operators
from app.db import templates as db_templates
from app.db.models import utcnow
from app.db.rows import AnswerResult, SampleRow
from app.db.states import AnswerStatus, Handoff
from tests.helpers.desks import desk_for
from tests.helpers.servers import ROOT, collect, full_blocks

NO_CHECK = lambda *_: None  # noqa: E731 (sizes are the console's concern, tested in test_admin_templates.py)


def test_migrations_make_every_table_and_the_seed_fills_them(fresh_db):
    tables = set(inspect(fresh_db.engine).get_table_names())
    assert tables == {"alembic_version", "templates", "template_versions", "conversations", "messages",
                      "cache_samples", "audit", "operators", "admin_sessions", "leases", "revisions", "ratings",
                      "options", "person_refusals"}
    names = [t.name for t in fresh_db.run(db_templates.published)]
    assert names == ["电商客服", "support-en", "商城通用规则", "电子产品", "服装鞋包"]
    families = {t.name: (t.family, t.internal) for t in fresh_db.run(db_templates.published)}
    assert families["电子产品"] == ("商城通用规则", False) and families["商城通用规则"] == ("商城通用规则", True)
    assert fresh_db.run(db_templates.revision) == 1
    assert fresh_db.run(db_templates.seed, template_files.read_folder(ROOT / "templates")) == 0  # only when empty


def test_the_migrated_schema_is_exactly_the_models(fresh_db):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from app.db.models import Base

    with fresh_db.engine.connect() as c:
        drift = compare_metadata(MigrationContext.configure(c, opts={"compare_type": False}), Base.metadata)
    assert drift == []


def test_a_turn_is_stored_before_the_answer_and_finished_after(fresh_db):
    t = fresh_db.run(db_templates.published)[0]
    turn = fresh_db.run(db_conversations.begin_turn, session_key="s1", conversation_id=None, template_id=t.id,
                        template_version_id=t.version_id, text="发票怎么开？", tenant="acme")
    rows = fresh_db.run(db_conversations.messages, conversation_id=turn.conversation_id)
    assert [(m.role, m.status, m.text) for m in rows] == [("user", "ok", "发票怎么开？"), ("assistant", "generating", "")]
    done = fresh_db.run(db_conversations.finish_answer, message_id=turn.answer_id, result=AnswerResult(
        text="可以。", status="ok", prompt_tokens=1063, num_cached_tokens=1024, ttft_ms=12.5, output_tokens=3,
        decode_tokens_per_s=250.0, replica="10.0.0.2:8001"))
    assert (done.status, done.num_cached_tokens, done.replica) == ("ok", 1024, "10.0.0.2:8001")
    assert fresh_db.run(db_conversations.owner, conversation_id=turn.conversation_id) == "s1"
    [conv] = fresh_db.run(db_conversations.list_for, session_key="s1")
    assert (conv.title, conv.template, conv.num_messages) == ("发票怎么开？", "电商客服", 2)
    assert fresh_db.run(db_conversations.list_for, session_key="someone else") == []


def test_rows_hold_states_as_types_stored_as_the_strings_of_before(fresh_db):
    t = fresh_db.run(db_templates.published)[0]
    turn = fresh_db.run(db_conversations.begin_turn, session_key="s", conversation_id=None, template_id=t.id,
                        template_version_id=t.version_id, text="我要人工")
    fresh_db.run(db_conversations.finish_answer, message_id=turn.answer_id,
                 result=AnswerResult(text="好的", status=AnswerStatus.STOPPED))
    fresh_db.run(db_conversations.request_person, session_key="s", conversation_id=turn.conversation_id)
    rows = fresh_db.run(db_conversations.messages, conversation_id=turn.conversation_id)
    assert [(type(m.status), m.status) for m in rows] == [(AnswerStatus, AnswerStatus.OK),
                                                          (AnswerStatus, AnswerStatus.STOPPED)]
    state = fresh_db.run(db_conversations.state_of, conversation_id=turn.conversation_id)
    assert (type(state.handoff), state.handoff) == (Handoff, Handoff.WAITING)
    assert fresh_db.run(db_conversations.handoff_of, conversation_id=turn.conversation_id) is Handoff.WAITING
    assert fresh_db.run(db_conversations.handoff_of, conversation_id=10**9) is Handoff.MODEL
    stored = fresh_db.run(lambda s: (s.execute(text("select status from messages order by id")).scalars().all(),
                                     s.execute(text("select handoff from conversations")).scalar_one()))
    assert stored == (["ok", "stopped"], "waiting")


def test_a_retry_replaces_the_last_answer_and_keeps_the_old_one_for_the_record(fresh_db):
    t = fresh_db.run(db_templates.published)[0]
    turn = fresh_db.run(db_conversations.begin_turn, session_key="s", conversation_id=None, template_id=t.id,
                        template_version_id=t.version_id, text="q1")
    fresh_db.run(db_conversations.finish_answer, message_id=turn.answer_id, result=AnswerResult(text="a1", status="ok"))
    again = fresh_db.run(db_conversations.begin_retry, session_key="s", conversation_id=turn.conversation_id,
                         template_version_id=t.version_id)
    assert (again.conversation_id, again.user_message_id) == (turn.conversation_id, turn.user_message_id)
    shown = fresh_db.run(db_conversations.messages, conversation_id=turn.conversation_id)
    assert [(m.role, m.status) for m in shown] == [("user", "ok"), ("assistant", "generating")]
    with pytest.raises(LookupError, match="That conversation does not exist here"):
        fresh_db.run(db_conversations.begin_retry, session_key="other", conversation_id=turn.conversation_id,
                     template_version_id=t.version_id)
    statuses = fresh_db.run(lambda s: [r[0] for r in s.execute(text(
        "select status from messages where role = 'assistant' order by id")).all()])
    assert statuses == ["replaced", "generating"]


def test_a_customer_rates_renames_and_deletes_only_their_own(fresh_db):
    run = fresh_db.run
    t = run(db_templates.published)[0]
    turn = run(db_conversations.begin_turn, session_key="mine", conversation_id=None, template_id=t.id,
               template_version_id=t.version_id, text="q")
    run(db_conversations.finish_answer, message_id=turn.answer_id,
        result=AnswerResult(text="a", status="ok", finish_reason="length"))
    rated = run(db_conversations.rate, session_key="mine", message_id=turn.answer_id, thumbs=-1, reason="太短" * 300)
    assert (rated.rating, len(rated.rating_reason), rated.cut_off) == (-1, 500, True)
    run(db_conversations.rate, session_key="mine", message_id=turn.answer_id, thumbs=1)  # a second rating replaces it
    run(db_conversations.set_first_visible, session_key="mine", message_id=turn.answer_id, ms=81.26)
    run(db_conversations.set_first_visible, session_key="mine", message_id=turn.answer_id, ms=5000)  # the first counts
    answer = run(db_conversations.messages, conversation_id=turn.conversation_id)[-1]
    assert (answer.rating, answer.rating_reason, answer.first_visible_ms, answer.finish_reason) == (1, "", 81.3, "length")
    assert run(lambda s: s.execute(text("select count(*) from ratings")).scalar()) == 1
    refused = [("a stranger", db_conversations.rate, dict(message_id=turn.answer_id, thumbs=1)),
               ("mine", db_conversations.rate, dict(message_id=turn.user_message_id, thumbs=1)),  # not an answer
               ("a stranger", db_conversations.set_first_visible, dict(message_id=turn.answer_id, ms=1.0)),
               ("a stranger", db_conversations.rename, dict(conversation_id=turn.conversation_id, title="x")),
               ("a stranger", db_conversations.delete, dict(conversation_id=turn.conversation_id)),
               ("a stranger", db_conversations.request_person, dict(conversation_id=turn.conversation_id))]
    for session_key, call, kwargs in refused:
        with pytest.raises(db_conversations.NotYours, match="That conversation does not exist here"):
            run(call, session_key=session_key, **kwargs)
    run(db_conversations.rename, session_key="mine", conversation_id=turn.conversation_id, title="退货" * 40)
    [conv] = run(db_conversations.list_for, session_key="mine")
    assert (conv.title, conv.template_version_id) == ("退货" * 30, t.version_id)
    run(db_conversations.delete, session_key="mine", conversation_id=turn.conversation_id)
    assert run(db_conversations.list_for, session_key="mine") == []
    with pytest.raises(db_conversations.NotYours):
        run(db_conversations.rename, session_key="mine", conversation_id=turn.conversation_id, title="again")


def test_a_person_takes_answers_and_releases_a_conversation_and_each_step_is_audited(fresh_db):
    run = fresh_db.run
    t = run(db_templates.published)[0]
    turn = run(db_conversations.begin_turn, session_key="c", conversation_id=None, template_id=t.id,
               template_version_id=t.version_id, text="我要人工")
    with pytest.raises(db_conversations.HandoffError, match="did not ask for a person"):
        run(db_conversations.take, conversation_id=turn.conversation_id, operator="alice")
    assert run(db_conversations.request_person, session_key="c", conversation_id=turn.conversation_id) is True
    assert run(db_conversations.request_person, session_key="c", conversation_id=turn.conversation_id) is False
    assert run(db_conversations.handoff_of, conversation_id=turn.conversation_id) == "waiting"
    with pytest.raises(db_conversations.HandoffError, match="take conversation"):
        run(db_conversations.person_reply, conversation_id=turn.conversation_id, operator="alice", text="您好")
    run(db_conversations.take, conversation_id=turn.conversation_id, operator="alice")
    reply = run(db_conversations.person_reply, conversation_id=turn.conversation_id, operator="alice", text="您好，我是小王")
    assert (reply.role, reply.author, reply.status, reply.template_version_id) == ("assistant", "alice", "ok",
                                                                                   t.version_id)
    with pytest.raises(db_conversations.HandoffError, match="take conversation"):
        run(db_conversations.person_reply, conversation_id=turn.conversation_id, operator="bob", text="我也来")
    run(db_conversations.release, conversation_id=turn.conversation_id, operator="alice")
    assert run(db_conversations.handoff_of, conversation_id=turn.conversation_id) == ""
    entries = [(e.user, e.action, e.field, e.before, e.after) for e in reversed(run(db_audit.recent))]
    assert entries == [("alice", "take conversation", "answered by", "waiting", "alice"),
                       ("alice", "reply as a person", "characters", None, "7"),
                       ("alice", "release conversation", "answered by", "alice", "model")]


def test_versions_publish_stale_saves_flags_and_the_audit(fresh_db):
    run = fresh_db.run
    run(db_templates.create, name="新模板", text="规则一。", user="op", check_fits=NO_CHECK, parent="商城通用规则")
    assert run(db_templates.save_version, name="新模板", text="规则二。", base_version=1, user="op",
               check_fits=NO_CHECK).after_version == 2
    with pytest.raises(db_templates.StaleVersion, match="from version 1, but version 2 was saved since"):
        run(db_templates.save_version, name="新模板", text="规则三。", base_version=1, user="op2", check_fits=NO_CHECK)
    assert run(db_templates.publish, name="新模板", version=2, user="op", check_fits=NO_CHECK).action == "publish"
    assert run(db_templates.publish, name="新模板", version=1, user="op", check_fits=NO_CHECK).action == "rollback"
    run(db_templates.set_flag, name="新模板", flag="pinned", value=True, user="op")
    new = next(t for t in run(db_templates.published) if t.name == "新模板")
    assert (new.chain[-1], new.family, new.pinned) == ("规则一。", "商城通用规则", True)
    with pytest.raises(db_templates.ParentHasChildren):
        run(db_templates.delete, name="商城通用规则", user="op")
    assert [(a.action, a.field, a.before, a.after) for a in run(db_audit.recent)[:5]] == [
        ("pin", "pinned", "no", "yes"), ("rollback", "published version", "2", "1"),
        ("publish", "published version", None, "2"), ("save", "latest version", "1", "2"),
        ("create", "latest version", None, "1")]
    assert run(db_templates.revision) == 6  # the seed, then five changes
    files = dict(run(db_templates.export_files))
    assert files["新模板.txt"] == "name: 新模板\nparent: 商城通用规则\nlanguage: zh\npinned: true\n---\n规则一。\n"
    assert files["商城通用规则.txt"].splitlines()[2:4] == ["internal: true", "---"]


def test_another_process_sees_a_publish_through_the_revision(fresh_db, services, aio):
    other = Database(fresh_db.url)  # a second web process on the same database
    mine, theirs = TemplateCatalog(fresh_db, services.prompts), TemplateCatalog(other, services.prompts)
    mine.load()
    theirs.load()
    fresh_db.run(db_templates.create, name="新品", text="新品规则。", user="op", check_fits=NO_CHECK, language="zh")
    fresh_db.run(db_templates.publish, name="新品", version=1, user="op", check_fits=NO_CHECK)
    assert "新品" not in [t.name for t in theirs.all()]

    revision = fresh_db.run(db_templates.revision)

    async def until_their_watch_refreshes():
        # Until their catalog holds the new revision (its refresh sets it with the templates), not for a fixed
        # 100 rounds of 50 ms: on a busy machine one refresh can take longer than that.
        watch = asyncio.ensure_future(theirs.watch(interval_s=0.05))
        try:
            while theirs.revision != revision:
                await asyncio.sleep(0.05)
        finally:
            watch.cancel()

    aio(asyncio.wait_for(until_their_watch_refreshes(), 300), timeout=330)
    assert "新品" in [t.name for t in theirs.all()]
    assert theirs.revision == fresh_db.run(db_templates.revision)
    other.close()


def test_one_process_at_a_time_holds_a_lease_until_it_expires(fresh_db):
    assert fresh_db.run(db_leases.acquire, name="keep-warm", holder="a", ttl_s=60)
    assert not fresh_db.run(db_leases.acquire, name="keep-warm", holder="b", ttl_s=60)
    assert fresh_db.run(db_leases.acquire, name="keep-warm", holder="a", ttl_s=60)  # renewed
    assert fresh_db.run(db_leases.holder_of, name="keep-warm") == "a"
    fresh_db.run(db_leases.release, name="keep-warm", holder="a")
    assert fresh_db.run(db_leases.acquire, name="keep-warm", holder="b", ttl_s=0.01)
    import time

    time.sleep(0.05)
    assert fresh_db.run(db_leases.holder_of, name="keep-warm") is None  # b died: expired
    assert fresh_db.run(db_leases.acquire, name="keep-warm", holder="a", ttl_s=60)


def test_operators_and_console_sessions(fresh_db):
    fresh_db.run(db_operators.add, name="alice", password_hash="scrypt$x")
    with pytest.raises(db_operators.OperatorExists):
        fresh_db.run(db_operators.add, name="alice", password_hash="scrypt$y")
    now = utcnow()
    fresh_db.run(db_operators.open_session, token_hash="h1", operator="alice", expires_at=now + timedelta(hours=1),
                 client="192.0.2.1")
    fresh_db.run(db_operators.open_session, token_hash="h2", operator="alice", expires_at=now - timedelta(seconds=1),
                 client="192.0.2.1")
    assert fresh_db.run(db_operators.find_session, token_hash="h1", now=now).operator == "alice"
    assert fresh_db.run(db_operators.find_session, token_hash="h2", now=now) is None  # expired
    fresh_db.run(db_operators.disable, name="alice")
    assert fresh_db.run(db_operators.find_session, token_hash="h1", now=now) is None  # disabling ends sessions
    assert fresh_db.run(db_operators.password_hash, name="alice") is None
    assert fresh_db.run(db_operators.prune_sessions, now=now + timedelta(hours=2)) == 2


def test_samples_hold_gpu_sized_memory_and_the_ttft_split(fresh_db):
    t0 = utcnow()
    big = 141 * (1 << 30)  # an H200's memory: past a 32-bit column
    fresh_db.run(db_metrics.add_sample, sample=SampleRow(t0, 0.95, 0.4, 10, 50, 3, 0, 12.0, 80.0, big))
    [row] = fresh_db.run(db_metrics.samples_since, since=t0 - timedelta(seconds=1))
    assert (row.memory_bytes, row.recent_hit_rate, row.blocks_cached) == (big, 0.95, 50)
    assert fresh_db.run(db_metrics.prune_samples, older_than=t0 + timedelta(seconds=1)) == 1


def test_the_desk_answers_on_this_database(fresh_db, services, aio, block_size):
    catalog = TemplateCatalog(fresh_db, services.prompts)
    catalog.load()
    desk = desk_for(services, db=fresh_db, catalog=catalog, tenant_secret="db-test")
    tenant = uuid.uuid4().hex  # a cache namespace no other test has warmed

    def ask(message):
        events = aio(collect(desk.answer(session_key="s", client="192.0.2.9", template_name="support-en",
                                         message=message, tenant=tenant, max_tokens=4, ignore_eos=True)))
        assert isinstance(events[-1], Finished)
        return events[-1].message

    first, second = ask("Where is my parcel?"), ask("Can I return it?")
    assert (first.num_cached_tokens, second.num_cached_tokens) == (
        0, full_blocks(len(catalog.prefix_ids("support-en")), block_size))
    usage = fresh_db.run(db_metrics.template_usage)
    assert usage["support-en"] == (2, first.prompt_tokens + second.prompt_tokens, second.num_cached_tokens)
    split = fresh_db.run(db_metrics.ttft_split, since=utcnow() - timedelta(minutes=1))
    assert (split.num_hits, split.num_misses) == (1, 1)


def test_the_console_changes_templates_and_the_chat_sees_them_at_once(fresh_db, services, aio):
    from admin.templates import PrefixMeter, Templates

    catalog = TemplateCatalog(fresh_db, services.prompts)
    catalog.load()
    meter = PrefixMeter(services.prompts, services.engine.info.block_size, 2048, 48)
    templates = Templates(fresh_db, meter, catalog)
    aio(templates.create(name="退货专员", text="只回答退货问题。", user="op", parent="商城通用规则"))
    aio(templates.publish(name="退货专员", version=1, user="op"))
    assert catalog.get("退货专员").chain == (catalog.get("商城通用规则").chain[0], "只回答退货问题。")
    rows = {r.name: r for r in aio(templates.rows())}
    assert (rows["退货专员"].num_tokens, rows["退货专员"].published_version) == (
        len(catalog.prefix_ids("退货专员")), 1)
