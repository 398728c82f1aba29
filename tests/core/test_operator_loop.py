"""The operator's loop through the desk on the real engine: a live split's arms, a conversation that stays on its
version, a conversation a person answers (the model does not), and the demo's cold-vs-warm story."""

import pytest

from app import template_files
from app.core.catalog import TemplateCatalog, split_version
from app.core.demo import DEMO_SALT_PREFIX, SameQuestion, cold_vs_warm, demo_questions
from app.core.desk import PERSON_NOTICE, WITH_PERSON, Finished, Progress
from app.core.prompts import Turn, system_text
from app.db import conversations as db_conversations
from app.db import open_database
from app.db import templates as db_templates
from tests.helpers.desks import desk_for
from tests.helpers.servers import collect, full_blocks

NO_CHECK = lambda *_: None  # noqa: E731
V2 = "Policy: answer in one short sentence, then offer a person."


@pytest.fixture()
def fresh(services, tmp_path):
    """The session engine with a database and catalog of this test's own."""
    db = open_database(f"sqlite:///{tmp_path / 'loop.db'}")
    db.run(db_templates.seed, template_files.read_folder(services.settings.templates_dir))
    catalog = TemplateCatalog(db, services.prompts)
    catalog.load()
    yield desk_for(services, db=db, catalog=catalog, tenant_secret="loop")
    db.close()


def ask(aio, desk, message, conversation_id=None, template="support-en", session="loop"):
    events = aio(collect(desk.answer(session_key=session, client="192.0.2.40", template_name=template,
                                     message=message, conversation_id=conversation_id, max_tokens=2,
                                     ignore_eos=True)))
    assert isinstance(events[-1], Finished) and all(isinstance(e, Progress) for e in events[:-1])
    return events[-1]


def test_a_split_gives_new_conversations_their_arm_and_each_stays_on_its_version(fresh, aio, services):
    db, catalog = fresh.db, fresh.catalog
    db.run(db_templates.save_version, name="support-en", text=V2, base_version=1, user="op", check_fits=NO_CHECK)
    db.run(db_templates.start_split, name="support-en", version=2, share=0.5, user="op", check_fits=NO_CHECK)
    catalog.load()
    published, candidate = catalog.get("support-en"), catalog.candidate("support-en")
    assert (published.version_number, candidate.version_number, candidate.chain) == (1, 2, (V2,))
    prompt_len = {v.version_id: len(services.prompts.build(system_text(v.chain), [], "Where is my parcel?").token_ids)
                  for v in (published, candidate)}
    assert prompt_len[published.version_id] != prompt_len[candidate.version_id]

    finished = [ask(aio, fresh, "Where is my parcel?") for _ in range(8)]
    versions = [f.message.template_version_id for f in finished]
    # The arm is a function of the conversation alone: the same draw as the desk's, conversation by conversation.
    assert versions == [split_version(published, f.message.conversation_id) for f in finished]
    assert sorted(set(versions)) == sorted({published.version_id, candidate.version_id})
    # Each answer's prompt is its own version's: the candidate's text, not the published one's.
    assert [f.message.prompt_tokens for f in finished] == [prompt_len[v] for v in versions]

    on_candidate = next(f.message for f in finished if f.message.template_version_id == candidate.version_id)
    db.run(db_templates.end_split, name="support-en", user="op")  # new conversations: the published version only
    catalog.load()
    history = [Turn(m.role, m.text) for m in db.run(db_conversations.messages,
                                                    conversation_id=on_candidate.conversation_id) if m.text]
    later = ask(aio, fresh, "And a second question?", conversation_id=on_candidate.conversation_id)
    assert later.message.template_version_id == candidate.version_id  # the conversation stays on v2
    expected = services.prompts.build(system_text(candidate.chain), history, "And a second question?")
    assert later.message.prompt_tokens == len(expected.token_ids)  # built on v2's text
    retried = aio(collect(fresh.retry(session_key="loop", client="192.0.2.40",
                                      conversation_id=on_candidate.conversation_id)))[-1]
    assert retried.message.template_version_id == candidate.version_id
    assert {ask(aio, fresh, "New customer").message.template_version_id for _ in range(3)} == {published.version_id}


def test_a_conversation_with_a_person_gets_no_model_answer_and_the_reply_is_polled(fresh, aio):
    db = fresh.db
    first = ask(aio, fresh, "I want to talk to a person.")
    cid = first.message.conversation_id
    assert db.run(db_conversations.request_person, session_key="loop", conversation_id=cid)

    held = ask(aio, fresh, "Hello? Is anyone there?", conversation_id=cid)
    assert (held.handoff, held.message.status, held.message.error, held.message.text) == (
        "waiting", WITH_PERSON, PERSON_NOTICE, "")
    stored = db.run(db_conversations.messages, conversation_id=cid)
    assert [(m.role, m.text, m.status) for m in stored] == [
        ("user", "I want to talk to a person.", "ok"), ("assistant", first.message.text, "ok"),
        ("user", "Hello? Is anyone there?", "ok")]  # stored, and no answer row for the model
    assert held.message.id == stored[-1].id  # the id the chat polls from
    retried = aio(collect(fresh.retry(session_key="loop", client="192.0.2.40", conversation_id=cid)))
    assert [(e.handoff, e.message.status) for e in retried] == [("waiting", WITH_PERSON)]

    db.run(db_conversations.take, conversation_id=cid, operator="alice")
    assert ask(aio, fresh, "Thanks for taking it", conversation_id=cid).handoff == "person"
    reply = db.run(db_conversations.person_reply, conversation_id=cid, operator="alice", text="Hi, Alice here.")
    polled = aio(fresh.messages_after(session_key="loop", conversation_id=cid, after_id=held.message.id))
    assert [(m.role, m.author, m.text) for m in polled] == [("user", "", "Thanks for taking it"),
                                                            ("assistant", "alice", "Hi, Alice here.")]
    assert polled[-1].id == reply.id
    assert aio(fresh.messages_after(session_key="loop", conversation_id=cid, after_id=reply.id)) == []

    db.run(db_conversations.release, conversation_id=cid, operator="alice")
    back = ask(aio, fresh, "One more thing", conversation_id=cid)
    assert (back.handoff, back.message.status, back.message.author) == ("", "ok", "")
    assert back.message.output_tokens == 2  # the model answers again


@pytest.mark.parametrize("name, language", [("电商客服", "zh"), ("support-en", "en")])
def test_the_warm_run_asks_another_question_and_reuses_exactly_the_templates_full_blocks(services, aio, name,
                                                                                          language):
    chain = services.catalog.get(name).chain
    cold_q, warm_q = demo_questions(language)
    assert cold_q != warm_q and cold_q[0] != warm_q[0]
    assert (language == "zh") == any("\u4e00" <= ch <= "\u9fff" for ch in cold_q + warm_q)
    r = aio(cold_vs_warm(services.engine, services.prompts, chain, cold_q, warm_q, max_tokens=2))
    prefix = len(services.prompts.prefix_ids(system_text(chain)))
    block = services.engine.info.block_size
    assert (r.prefix_tokens, r.cold.question, r.warm.question) == (prefix, cold_q, warm_q)
    assert r.cold.stats.num_cached_tokens == 0  # a fresh namespace
    assert r.warm.stats.num_cached_tokens == full_blocks(prefix, block) == r.prefix_blocks * block
    assert r.shared_blocks == r.prefix_blocks
    with pytest.raises(SameQuestion):
        aio(cold_vs_warm(services.engine, services.prompts, chain, cold_q, cold_q + " ", max_tokens=2))
    assert DEMO_SALT_PREFIX == "demo-"
