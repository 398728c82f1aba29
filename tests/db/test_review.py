"""The operator's review queries on a real database: the filtered, paged list (waiting first), transcripts,
exports, versions judged by their answers, live splits, options, and what a person's conversation stores."""

import csv
import io
import json
from datetime import timedelta

import pytest

from app.db import audit as db_audit
from app.db import conversations as db_conversations
from app.db import review as db_review
from app.db import templates as db_templates
from app.db.models import Conversation, utcnow
from app.db.review import ReviewInputError
from app.db.rows import AnswerResult, PersonQueue, ReviewFilter

NO_CHECK = lambda *_: None  # noqa: E731


def template(db, name):
    return next(t for t in db.run(db_templates.published) if t.name == name)


def conversation(db, name, question, *, status="ok", answer="好的", session="s", tenant="", cached=0):
    """A stored turn: the question and its finished answer; returns the TurnIds."""
    t = template(db, name)
    turn = db.run(db_conversations.begin_turn, session_key=session, conversation_id=None, template_id=t.id,
                  template_version_id=t.version_id, text=question, tenant=tenant)
    db.run(db_conversations.finish_answer, message_id=turn.answer_id, result=AnswerResult(
        text=answer, status=status, error=None if status == "ok" else f"{status} reason", prompt_tokens=100,
        num_cached_tokens=cached, ttft_ms=20.0, output_tokens=5, decode_tokens_per_s=50.0, finish_reason="stop"))
    return turn


def ids(page):
    return [r.id for r in page.rows]


def test_the_list_filters_and_pages_with_the_conversations_waiting_for_a_person_first(fresh_db):
    run = fresh_db.run
    a = conversation(fresh_db, "电商客服", "屏幕碎了能退吗？")
    run(db_conversations.rate, session_key="s", message_id=a.answer_id, thumbs=-1, reason="答非所问")
    b = conversation(fresh_db, "support-en", "Where is my parcel?", status="error")
    c = conversation(fresh_db, "电商客服", "我要找人工")
    d = conversation(fresh_db, "support-en", "A person, please")
    e = conversation(fresh_db, "电商客服", "双十一 50%_off 还有吗？", status="stopped", tenant="acme")
    run(db_conversations.request_person, session_key="s", conversation_id=c.conversation_id)
    run(db_conversations.request_person, session_key="s", conversation_id=d.conversation_id)
    a, b, c, d, e = (x.conversation_id for x in (a, b, c, d, e))

    def search(page_size=20, page=1, **f):
        return run(db_review.search, filter=ReviewFilter(**f), page=page, page_size=page_size)

    everything = search()
    assert (ids(everything), everything.total) == ([c, d, e, b, a], 5)  # waiting (longest first), then newest
    first = everything.rows[0]
    assert (first.handoff, first.template, first.version, first.num_messages, first.status) == (
        "waiting", "电商客服", 1, 2, "ok")
    assert [(r.id, r.ups, r.downs, r.status) for r in everything.rows[-2:]] == [(b, 0, 0, "error"), (a, 0, 1, "ok")]
    assert ids(search(text="50%_off")) == [e]  # % and _ are the text itself, not wildcards
    assert ids(search(text="%")) == [e]
    assert ids(search(text="_")) == [e]
    assert ids(search(text="parcel")) == [b]
    assert ids(search(rating="down")) == [a]
    assert ids(search(rating="up")) == []
    assert ids(search(rating="unrated")) == [c, d, e, b]
    assert ids(search(status="error")) == [b]
    assert ids(search(status="stopped")) == [e]
    assert ids(search(status="waiting")) == [c, d]
    assert ids(search(template="support-en")) == [d, b]
    assert ids(search(version=1)) == [c, d, e, b, a]
    assert ids(search(version=2)) == []
    assert ids(search(tenant="acme")) == [e]
    assert ids(search(tenant="")) == [c, d, b, a]
    assert run(db_review.tenants) == ["", "acme"]
    pages = [search(page_size=2, page=n) for n in (1, 2, 3)]
    assert [ids(p) for p in pages] == [[c, d], [e, b], [a]]
    assert {(p.total, p.num_pages) for p in pages} == {(5, 3)}


@pytest.mark.parametrize("bad, message", [
    (dict(text="x" * 201), "at most 200 characters"),
    (dict(text=["屏幕"]), "The text filter must be text"),
    (dict(rating="sideways"), "The rating filter is one of: any, up, down, unrated"),
    (dict(status="lost"), "The status filter is one of"),
    (dict(version="1"), "version number"),
    (dict(version=True), "version number"),
    (dict(version=0), "version number"),
    (dict(tenant=7), "The tenant filter must be text"),
])
def test_a_filter_of_the_wrong_type_size_or_value_is_refused_before_any_query(fresh_db, bad, message):
    with pytest.raises(ReviewInputError, match=message):
        fresh_db.run(db_review.search, filter=ReviewFilter(**bad))


@pytest.mark.parametrize("page, page_size", [(0, 20), (1, 0), (1, 101), ("1", 20), (1.5, 20), (True, 20)])
def test_a_page_outside_the_bounds_is_refused(fresh_db, page, page_size):
    with pytest.raises(ReviewInputError, match="A page is a number from 1, of 1 to 100 conversations"):
        fresh_db.run(db_review.search, filter=ReviewFilter(), page=page, page_size=page_size)


def test_a_transcript_has_every_answer_with_its_numbers_rating_and_author(fresh_db):
    run = fresh_db.run
    turn = conversation(fresh_db, "电商客服", "发票怎么开？", cached=64)
    run(db_conversations.rate, session_key="s", message_id=turn.answer_id, thumbs=1, reason="很清楚")
    run(db_conversations.set_first_visible, session_key="s", message_id=turn.answer_id, ms=42.26)
    run(db_conversations.request_person, session_key="s", conversation_id=turn.conversation_id)
    run(db_conversations.take, conversation_id=turn.conversation_id, operator="alice")
    run(db_conversations.person_reply, conversation_id=turn.conversation_id, operator="alice", text="我来帮您开")
    found = run(db_review.transcript, conversation_id=turn.conversation_id)
    assert (found.conversation.handoff, found.conversation.handoff_operator, found.conversation.num_messages) == (
        "person", "alice", 3)
    assert [(m.role, m.author, m.text) for m in found.messages] == [
        ("user", "", "发票怎么开？"), ("assistant", "", "好的"), ("assistant", "alice", "我来帮您开")]
    answer = found.messages[1]
    assert (answer.prompt_tokens, answer.num_cached_tokens, answer.ttft_ms, answer.first_visible_ms,
            answer.decode_tokens_per_s, answer.finish_reason, answer.rating, answer.rating_reason) == (
        100, 64, 20.0, 42.3, 50.0, "stop", 1, "很清楚")
    assert run(db_review.transcript, conversation_id=10**9) is None


def test_exports_stream_csv_and_jsonl_defuse_formulas_and_leave_texts_out_when_hidden(fresh_db):
    run = fresh_db.run
    hostile = "=HYPERLINK(\"http://evil.example\",\"点我\")"
    turn = conversation(fresh_db, "support-en", hostile, answer="+1 we can help")
    run(db_conversations.rate, session_key="s", message_id=turn.answer_id, thumbs=-1, reason="@everyone bad")
    conversation(fresh_db, "电商客服", "别的问题")
    only = ReviewFilter(template="support-en")

    out = io.StringIO()
    assert run(db_review.export, filter=only, fmt="csv", out=out, include_text=True) == 2
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0]) == list(db_review.EXPORT_FIELDS)
    assert [(r["role"], r["text"], r["rating"], r["rating_reason"]) for r in rows] == [
        ("user", "'" + hostile, "", ""), ("assistant", "'+1 we can help", "-1", "'@everyone bad")]
    assert (rows[1]["template"], rows[1]["version"], rows[1]["prompt_tokens"], rows[1]["finish_reason"]) == (
        "support-en", "1", "100", "stop")

    out = io.StringIO()
    assert run(db_review.export, filter=only, fmt="jsonl", out=out, include_text=False) == 2
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [sorted(set(db_review.EXPORT_FIELDS) - set(r)) for r in records] == [["error", "rating_reason", "text"]] * 2
    assert [(r["role"], r["rating"], r["num_cached_tokens"]) for r in records] == [("user", None, None),
                                                                                  ("assistant", -1, 0)]
    with pytest.raises(ReviewInputError, match="Export as csv or jsonl"):
        run(db_review.export, filter=only, fmt="xlsx", out=io.StringIO(), include_text=True)


def test_a_split_compares_its_arms_since_it_began_and_every_step_is_audited(fresh_db):
    run = fresh_db.run
    name = "support-en"
    run(db_templates.save_version, name=name, text="Be brief.", base_version=1, user="op", check_fits=NO_CHECK)
    early = conversation(fresh_db, name, "before the split")  # on v1, before the split: not in the arms
    run(db_conversations.rate, session_key="s", message_id=early.answer_id, thumbs=1)
    for bad, message in ((0.0, "between 1% and 99%"), (1.0, "between 1% and 99%"), ("0.5", "between 1% and 99%"),
                         (True, "between 1% and 99%")):
        with pytest.raises(db_templates.TemplateAdminError, match=message):
            run(db_templates.start_split, name=name, version=2, share=bad, user="op", check_fits=NO_CHECK)
    with pytest.raises(db_templates.TemplateAdminError, match="v1 is the published version"):
        run(db_templates.start_split, name=name, version=1, share=0.5, user="op", check_fits=NO_CHECK)
    run(db_templates.start_split, name=name, version=2, share=0.5, user="op", check_fits=NO_CHECK)
    published = template(fresh_db, name)
    [candidate] = run(db_templates.candidates)
    assert (published.candidate_version_id, published.candidate_share) == (candidate.version_id, 0.5)
    assert (candidate.name, candidate.version_number, candidate.chain) == (name, 2, ("Be brief.",))

    # Conversations since the split: two on each arm; the candidate's answers are rated down.
    arms = {}
    for i, arm in enumerate([published.version_id, candidate.version_id] * 2):
        turn = run(db_conversations.begin_turn, session_key="s", conversation_id=None, template_id=published.id,
                   template_version_id=published.version_id, text=f"q{i}", arm=lambda _cid, arm=arm: arm)
        assert turn.template_version_id == arm
        run(db_conversations.finish_answer, message_id=turn.answer_id, result=AnswerResult(
            text="a", status="ok", prompt_tokens=100, num_cached_tokens=96 if arm == published.version_id else 64,
            ttft_ms=10.0 * (i + 1), finish_reason="stop"))
        run(db_conversations.rate, session_key="s", message_id=turn.answer_id,
            thumbs=1 if arm == published.version_id else -1)
        arms.setdefault(arm, []).append(turn.conversation_id)
    view = run(db_review.split_view, template=name)
    assert (view.published, view.candidate, view.share) == (1, 2, 0.5)
    assert [(v.number, v.published, v.candidate, v.num_conversations, v.num_answers, v.ups, v.downs)
            for v in view.versions] == [(2, False, True, 2, 2, 0, 2), (1, True, False, 3, 3, 3, 0)]
    assert [(v.number, v.num_answers, v.ups, v.downs, v.up_share, v.cached_share, v.ttft_p50_ms)
            for v in view.arms] == [(1, 2, 2, 0, 1.0, 0.96, 20.0), (2, 2, 0, 2, 0.0, 0.64, 30.0)]

    change = run(db_templates.promote_candidate, name=name, user="op", check_fits=NO_CHECK)
    assert (change.before_version, change.after_version) == (1, 2)
    assert run(db_templates.candidates) == []
    assert template(fresh_db, name).version_number == 2
    # A conversation stays on the version it started on, whatever is published since.
    kept = run(db_conversations.state_of, conversation_id=arms[published.version_id][0])
    assert kept.template_version_id == published.version_id
    with pytest.raises(db_templates.TemplateAdminError, match="has no live split"):
        run(db_templates.end_split, name=name, user="op")
    run(db_templates.start_split, name=name, version=1, share=0.1, user="op", check_fits=NO_CHECK)
    run(db_templates.end_split, name=name, user="op")
    assert [(e.action, e.field, e.before, e.after) for e in run(db_audit.recent)[:7]] == [
        ("end split", "candidate version", "1", None),
        ("start split", "candidate share", None, "10%"),
        ("start split", "candidate version", None, "1"),
        ("promote candidate", "candidate version", "2", None),
        ("publish", "published version", "1", "2"),
        ("start split", "candidate share", None, "50%"),
        ("start split", "candidate version", None, "2")]


def test_a_conversation_a_person_answers_stores_the_customers_message_alone(fresh_db):
    run = fresh_db.run
    turn = conversation(fresh_db, "电商客服", "我要人工")
    cid = turn.conversation_id
    run(db_conversations.request_person, session_key="s", conversation_id=cid)
    held = run(db_conversations.begin_turn, session_key="s", conversation_id=cid, template_id=1,
               template_version_id=turn.template_version_id, text="还在吗？")
    assert (held.answer_id, held.handoff) == (None, "waiting")
    with pytest.raises(db_conversations.WithPerson) as refused:
        run(db_conversations.begin_retry, session_key="s", conversation_id=cid,
            template_version_id=turn.template_version_id)
    assert (refused.value.handoff, refused.value.message_id) == ("waiting", held.user_message_id)
    run(db_conversations.take, conversation_id=cid, operator="alice")
    reply = run(db_conversations.person_reply, conversation_id=cid, operator="alice", text="在的，请讲")
    polled = run(db_conversations.messages_after, session_key="s", conversation_id=cid, after_id=held.user_message_id)
    assert [(m.id, m.role, m.author, m.text) for m in polled] == [(reply.id, "assistant", "alice", "在的，请讲")]
    assert run(db_conversations.messages_after, session_key="s", conversation_id=cid, after_id=reply.id) == []
    everything = run(db_conversations.messages_after, session_key="s", conversation_id=cid, after_id=0)
    assert [m.text for m in everything] == ["我要人工", "好的", "还在吗？", "在的，请讲"]
    with pytest.raises(db_conversations.NotYours):
        run(db_conversations.messages_after, session_key="someone else", conversation_id=cid, after_id=0)


def test_an_option_change_is_stored_and_audited(fresh_db):
    run = fresh_db.run
    assert run(db_review.get_option, name="hide_transcripts") == "no"
    run(db_review.set_option, name="hide_transcripts", value="yes", user="alice")
    assert run(db_review.get_option, name="hide_transcripts") == "yes"
    [entry] = run(db_audit.recent, limit=1)
    assert (entry.user, entry.action, entry.target, entry.field, entry.before, entry.after) == (
        "alice", "set option", "console", "hide_transcripts", "no", "yes")
    with pytest.raises(KeyError):
        run(db_review.set_option, name="debug", value="yes", user="alice")


def test_the_waiting_order_does_not_depend_on_how_the_backend_sorts_missing_times(fresh_db):
    run = fresh_db.run
    turns = [conversation(fresh_db, "电商客服", f"问题 {i}") for i in range(3)]
    run(db_conversations.request_person, session_key="s", conversation_id=turns[2].conversation_id)

    def backdate(s, *, conversation_id, minutes):
        s.get(Conversation, conversation_id).handoff_requested_at = utcnow() - timedelta(minutes=minutes)

    run(db_conversations.request_person, session_key="s", conversation_id=turns[0].conversation_id)
    run(backdate, conversation_id=turns[0].conversation_id, minutes=5)
    page = run(db_review.search, filter=ReviewFilter())
    assert ids(page) == [turns[0].conversation_id, turns[2].conversation_id, turns[1].conversation_id]


def test_the_person_queue_counts_the_waiting_and_names_the_longest_waiting_first(fresh_db):
    run = fresh_db.run
    assert run(db_review.person_queue) == PersonQueue(0, (), ())
    turns = [conversation(fresh_db, "电商客服", f"找人工 {i}") for i in range(4)]
    a, b, c, d = (x.conversation_id for x in turns)
    for cid in (a, b, c, d):
        run(db_conversations.request_person, session_key="s", conversation_id=cid)
    now = utcnow()

    def asked(cid, minutes):
        def set_at(s):
            s.get(Conversation, cid).handoff_requested_at = now - timedelta(minutes=minutes)
        run(set_at)

    for cid, minutes in ((a, 5), (b, 30), (c, 1), (d, 12)):
        asked(cid, minutes)
    run(db_conversations.take, conversation_id=c, operator="ana")  # taken: no longer waiting
    queue = run(db_review.person_queue, oldest=2, newest=2)
    assert (queue.total, [cid for cid, _ in queue.oldest], queue.newest_ids) == (3, [b, d], (a, d))
    assert [at for _, at in queue.oldest] == [now - timedelta(minutes=30), now - timedelta(minutes=12)]
