"""What customers see of a topic (its title, the questions an empty chat suggests) from the template files to
the catalog, set by an operator and audited; and a customer's edited last question through the desk: the new
question and answer replace the old ones, which stay in the record."""

from datetime import timedelta

import pytest
from sqlalchemy import text

from app import template_files
from app.core.catalog import TemplateCatalog
from app.core.desk import DeskInputError, Finished, Progress
from app.core.prompts import Turn, system_text
from app.db import conversations as db_conversations
from app.db import open_database
from app.db import templates as db_templates
from app.db.models import utcnow
from app.db.rows import AnswerResult, MessageRow
from app.db.templates import TemplateAdminError
from app.chat.render import _feedback, _message, shown_answer
from tests.helpers.desks import desk_for
from tests.helpers.servers import ROOT, collect

NO_CHECK = lambda *_: None  # noqa: E731
CLIENT = "192.0.2.41"


def test_a_template_file_carries_its_title_and_suggested_questions_both_ways():
    content = ("name: 电子产品\nparent: 商城通用规则\nlanguage: zh\ntitle: 手机电脑数码\nexample: 屏幕碎了能保修吗？\n"
               "example:  电脑激活后还能退吗？ \n---\n当前商品类别：电子产品。\n")
    parsed = template_files.parse(content)
    assert (parsed.title, parsed.examples) == ("手机电脑数码", ("屏幕碎了能保修吗？", "电脑激活后还能退吗？"))
    assert template_files.render(parsed) == content.replace("example:  电脑激活后还能退吗？ ", "example: 电脑激活后还能退吗？")
    assert template_files.parse(template_files.render(parsed)) == parsed
    plain = template_files.parse("name: a\n---\ntext")
    assert (plain.title, plain.examples) == ("", ())
    assert template_files.render(plain) == "name: a\nlanguage: zh\n---\ntext\n"


def test_titles_and_questions_past_their_limits_are_refused_with_what_to_change():
    with pytest.raises(template_files.TemplateFileError) as too_many:
        template_files.parse("name: a\n" + "".join(f"example: q{i}\n" for i in range(5)) + "---\ntext")
    assert str(too_many.value) == ("<text>: 5 suggested questions; an empty chat shows at most 4. Keep the best "
                                   "ones.")
    with pytest.raises(template_files.TemplateFileError) as long_title:
        template_files.parse("name: a\ntitle: " + "长" * 61 + "\n---\ntext")
    assert str(long_title.value) == ("<text>: the title has 61 characters; at most 60 fit the topic picker. "
                                     "Shorten it.")
    for title in ("退换货\ninternal: true", "a\rb", "a\u2028b"):  # no header lines smuggled into an export
        with pytest.raises(ValueError) as broken:
            template_files.check_presentation(title, [])
        assert str(broken.value) == "the title must be one line of text, without line breaks or control characters."
    with pytest.raises(ValueError) as long_question:
        template_files.check_presentation("", ["问" * 201])
    assert str(long_question.value) == "a suggested question has 201 characters; at most 200. Shorten it."


def test_the_shipped_topics_have_titles_and_questions_and_their_prompts_are_as_before():
    shipped = {f.name: f for f in template_files.read_folder(ROOT / "templates")}
    assert {n: f.title for n, f in shipped.items()} == {
        "电商客服": "购物咨询", "support-en": "Orders and returns", "商城通用规则": "", "电子产品": "手机电脑数码",
        "服装鞋包": ""}
    assert [len(shipped[n].examples) for n in ("电商客服", "support-en", "电子产品", "服装鞋包")] == [3, 3, 2, 2]
    # The header lines are no part of the prompt: the benchmarks' 1,042-token 电商客服 is as it was.
    assert [len(shipped[n].text) for n in ("电商客服", "support-en", "商城通用规则")] == [971, 1774, 163]


@pytest.fixture()
def store(services, tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'topics.db'}")
    db.run(db_templates.seed, template_files.read_folder(ROOT / "templates"))
    catalog = TemplateCatalog(db, services.prompts)
    catalog.load()
    yield db, catalog
    db.close()


def test_an_operator_sets_what_customers_see_and_it_is_audited(store):
    db, catalog = store
    assert (catalog.get("电子产品").shown_name, catalog.get("服装鞋包").shown_name) == ("手机电脑数码", "服装鞋包")
    db.run(db_templates.set_presentation, name="服装鞋包", title="衣服鞋子", examples=["  能换码吗？", "", "包邮吗？"],
           user="alice")
    catalog.load()
    assert (catalog.get("服装鞋包").title, catalog.get("服装鞋包").examples) == ("衣服鞋子", ("能换码吗？", "包邮吗？"))
    detail = db.run(db_templates.detail, name="服装鞋包")
    assert (detail.title, detail.examples) == ("衣服鞋子", ("能换码吗？", "包邮吗？"))
    audit = db.run(lambda s: s.execute(text("select user, action, target, before, after from audit "
                                            "where action = 'present'")).all())
    assert [tuple(r) for r in audit] == [("alice", "present", "服装鞋包", " | 尺码不合适可以换吗？ | 身高170、体重60公斤穿什么码？",
                                          "衣服鞋子 | 能换码吗？ | 包邮吗？")]
    with pytest.raises(TemplateAdminError) as refused:
        db.run(db_templates.set_presentation, name="服装鞋包", title="", examples=["a", "b", "c", "d", "e"],
               user="alice")
    assert str(refused.value) == "5 suggested questions; an empty chat shows at most 4. Keep the best ones."
    assert db.run(db_templates.detail, name="服装鞋包").examples == ("能换码吗？", "包邮吗？")  # nothing written


def test_import_and_export_carry_what_customers_see(store):
    db, catalog = store
    content = "name: 服装鞋包\nparent: 商城通用规则\nlanguage: zh\ntitle: 穿搭\nexample: 怎么选尺码？\n---\n" + \
        catalog.get("服装鞋包").chain[-1]
    changes = db.run(db_templates.import_files, files=[template_files.parse(content)], user="bob", check_fits=NO_CHECK)
    assert [(c.template, c.before_version, c.after_version) for c in changes] == [("服装鞋包", 1, 1)]  # text unchanged
    exported = dict(db.run(db_templates.export_files))
    assert [line for line in exported["服装鞋包.txt"].splitlines()[:5]] == [
        "name: 服装鞋包", "parent: 商城通用规则", "language: zh", "title: 穿搭", "example: 怎么选尺码？"]


def ask(aio, desk, message, conversation_id=None, session="edits"):
    events = aio(collect(desk.answer(session_key=session, client=CLIENT, template_name="support-en",
                                     message=message, conversation_id=conversation_id, max_tokens=2,
                                     ignore_eos=True)))
    assert isinstance(events[-1], Finished) and all(isinstance(e, Progress) for e in events[:-1])
    return events[-1]


def test_an_edited_last_question_replaces_it_and_its_answer_and_keeps_both_on_record(store, services, aio):
    db, catalog = store
    desk = desk_for(services, db=db, catalog=catalog)
    first = ask(aio, desk, "Can I return boots?")
    cid = first.message.conversation_id
    second = ask(aio, desk, "And jackets?", conversation_id=cid)
    with pytest.raises(DeskInputError) as stale:  # a page that still shows the first question as the last
        aio(collect(desk.edit_last(session_key="edits", client=CLIENT, conversation_id=cid,
                                   message=desk.admit(client=CLIENT, message="And tents?"),
                                   replaces=lambda text: text == "Can I return boots?")))
    assert stale.value.code == "edit_stale"
    assert [m.status for m in db.run(db_conversations.messages, conversation_id=cid)] == ["ok"] * 4  # nothing changed
    edited = aio(collect(desk.edit_last(session_key="edits", client=CLIENT, conversation_id=cid,
                                        message=desk.admit(client=CLIENT, message="  And tents? "),
                                        replaces=lambda text: text == "And jackets?")))[-1]
    assert isinstance(edited, Finished) and edited.message.status == "ok"
    shown = db.run(db_conversations.messages, conversation_id=cid)
    assert [(m.role, m.text) for m in shown] == [("user", "Can I return boots?"), ("assistant", first.message.text),
                                                 ("user", "And tents?"), ("assistant", edited.message.text)]
    kept = db.run(lambda s: s.execute(text("select id, role, status from messages where conversation_id = :c "
                                           "order by id"), {"c": cid}).all())
    assert [tuple(r)[1:] for r in kept] == [("user", "ok"), ("assistant", "ok"), ("user", "replaced"),
                                            ("assistant", "replaced"), ("user", "ok"), ("assistant", "ok")]
    assert kept[3][0] == second.message.id  # the old answer, kept
    template = catalog.get("support-en")
    expected = services.prompts.build(system_text(template.chain),
                                      [Turn("user", "Can I return boots?"), Turn("assistant", first.message.text)],
                                      "And tents?")
    assert edited.message.prompt_tokens == len(expected.token_ids)  # the old question is no context
    assert [c.title for c in aio(desk.list_conversations(session_key="edits"))] == ["Can I return boots?"]


def test_editing_the_only_question_retitles_the_conversation_and_a_person_holds_edits_too(store, services, aio):
    db, catalog = store
    desk = desk_for(services, db=db, catalog=catalog)
    cid = ask(aio, desk, "Where is my order?").message.conversation_id
    aio(collect(desk.edit_last(session_key="edits", client=CLIENT, conversation_id=cid,
                               message=desk.admit(client=CLIENT, message="Where is order 1042?"),
                               replaces=lambda text: text == "Where is my order?")))
    assert [c.title for c in aio(desk.list_conversations(session_key="edits"))] == ["Where is order 1042?"]
    assert db.run(db_conversations.request_person, session_key="edits", conversation_id=cid)
    with pytest.raises(DeskInputError) as with_person:  # the person answers what was asked: nothing replaced
        aio(collect(desk.edit_last(session_key="edits", client=CLIENT, conversation_id=cid,
                                   message=desk.admit(client=CLIENT, message="Hello?"), replaces=lambda _: True)))
    assert with_person.value.code == "edit_with_person"
    with pytest.raises(DeskInputError) as not_yours:
        aio(collect(desk.edit_last(session_key="someone else", client=CLIENT, conversation_id=cid,
                                   message=desk.admit(client=CLIENT, message="mine now"), replaces=lambda _: True)))
    assert not_yours.value.code == "no_conversation"
    assert [m.text for m in db.run(db_conversations.messages, conversation_id=cid) if m.role == "user"] == [
        "Where is order 1042?"]  # neither stored a question


def _row(id: int, rating: int | None) -> MessageRow:
    return MessageRow(id=id, conversation_id=1, role="assistant", text="", status="ok", error=None,
                      template_version_id=1, prompt_tokens=None, num_cached_tokens=None, ttft_ms=None,
                      output_tokens=None, decode_tokens_per_s=None, replica=None, created_at=None, rating=rating)


def test_the_chat_marks_each_answer_groups_stored_thumbs_and_hides_the_person_marker():
    messages = [_message("user", "q1"), _message("assistant", "a1"), _message("assistant", "caption", "t", 11),
                _message("user", "q2"), _message("assistant", "a2"), _message("assistant", "caption", "t", 12),
                _message("assistant", "提示：已为您转接人工客服"), _message("user", "q3"), _message("assistant", "notice")]
    assert _feedback(messages, [_row(11, -1), _row(12, 1)]) == ["Dislike", "Like", None]
    assert _feedback(messages, []) == [None, None, None]
    assert shown_answer("这个问题需要人工处理。\n【转人工】") == "这个问题需要人工处理。\n"
    assert shown_answer("A person will help.\n[[person]]") == "A person will help.\n"


ANY_EDIT = {"text": "My parcel?", "replaces": lambda _: True}  # an edit of whatever the last question is


def test_retry_and_edit_wait_for_an_answer_still_being_written_and_a_replaced_answer_stays_replaced(store):
    db, catalog = store
    template = catalog.get("support-en")
    turn = db.run(db_conversations.begin_turn, session_key="race", conversation_id=None, template_id=template.id,
                  template_version_id=template.version_id, text="Where is my parcel?")
    for begin, extra in ((db_conversations.begin_retry, {}), (db_conversations.begin_edit, ANY_EDIT)):
        with pytest.raises(db_conversations.StillAnswering):
            db.run(begin, session_key="race", conversation_id=turn.conversation_id,
                   template_version_id=template.version_id, **extra)
    # An answer left "generating" by a process that died long ago does not hold the conversation.
    db.run(lambda s: s.execute(text("update messages set created_at = :t where id = :i"),
                               {"t": utcnow() - db_conversations.STALE_GENERATING - timedelta(seconds=1),
                                "i": turn.answer_id}))
    retried = db.run(db_conversations.begin_retry, session_key="race", conversation_id=turn.conversation_id,
                     template_version_id=template.version_id)
    late = db.run(db_conversations.finish_answer, message_id=turn.answer_id,
                  result=AnswerResult(text="late words", status="ok"))
    assert (late.status, late.text) == ("replaced", "late words")  # the old stream ended after the retry began
    assert [m.id for m in db.run(db_conversations.messages, conversation_id=turn.conversation_id)] == [
        turn.user_message_id, retried.answer_id]


def cut_off(db, template, session_key: str, question: str, answer: str):
    """A new conversation whose one answer was cut off at its length: its turn."""
    turn = db.run(db_conversations.begin_turn, session_key=session_key, conversation_id=None, template_id=template.id,
                  template_version_id=template.version_id, text=question)
    db.run(db_conversations.finish_answer, message_id=turn.answer_id,
           result=AnswerResult(text=answer, status="ok", finish_reason="length"))
    return turn


def test_a_reopened_answer_being_continued_holds_retry_and_edit_however_old_it_is(store):
    db, catalog = store
    template = catalog.get("support-en")
    turn = cut_off(db, template, "old", "Tell me everything", "Returns are")
    long_ago = utcnow() - db_conversations.STALE_GENERATING - timedelta(minutes=1)
    db.run(lambda s: s.execute(text("update messages set created_at = :t, finished_at = :t where id = :i"),
                               {"t": long_ago, "i": turn.answer_id}))
    reopened, partial = db.run(db_conversations.begin_continue, session_key="old", conversation_id=turn.conversation_id)
    assert (reopened.answer_id, partial) == (turn.answer_id, "Returns are")
    with pytest.raises(db_conversations.StillAnswering):  # reopened a moment ago, though begun long ago
        db.run(db_conversations.begin_retry, session_key="old", conversation_id=turn.conversation_id,
               template_version_id=template.version_id)


def test_a_deleted_conversation_is_neither_retried_nor_edited_nor_continued(store):
    db, catalog = store
    template = catalog.get("support-en")
    turn = cut_off(db, template, "gone", "Where is my parcel?", "It is")
    db.run(db_conversations.delete, session_key="gone", conversation_id=turn.conversation_id)
    for begin, extra in ((db_conversations.begin_retry, {"template_version_id": template.version_id}),
                         (db_conversations.begin_edit, {**ANY_EDIT, "template_version_id": template.version_id}),
                         (db_conversations.begin_continue, {})):
        with pytest.raises(db_conversations.NotYours):
            db.run(begin, session_key="gone", conversation_id=turn.conversation_id, **extra)
    assert [(m.role, m.status, m.text) for m in db.run(db_conversations.messages, conversation_id=turn.conversation_id)] == [
        ("user", "ok", "Where is my parcel?"), ("assistant", "ok", "It is")]
