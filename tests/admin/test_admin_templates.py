"""Template versions, diffs and refusals, on the real tokenizer and a real SQLite file."""

import uuid

import pytest

from admin.preview import cache_hazards, preview
from admin.templates import TemplateTooLong, text_diff
from app.core.prompts import system_text
from app.db import templates as db_templates

BODY = "\n".join(f"Rule {i}: answer question type {i} politely, give the policy first, then the steps."
                 for i in range(12))


@pytest.fixture(scope="module")
def tpl(console, aio):
    """The console's template operations, called synchronously."""
    class Sync:
        def __getattr__(self, name):
            method = getattr(console.templates, name)
            return lambda *a, **kw: aio(method(*a, **kw))
    return Sync()


def new_template(tpl, text=BODY, parent=""):
    name = f"t-{uuid.uuid4().hex[:8]}"
    tpl.create(name=name, text=text, user="tester", parent=parent)
    return name


def test_diff_reports_first_differing_token_and_shared_blocks(tpl, console, services):
    name = new_template(tpl)
    end_edit = BODY + "\nRule 12: thank the customer."
    top_edit = "Be brief.\n" + BODY
    tpl.save(name=name, text=end_edit, base_version=1, user="tester")
    tpl.save(name=name, text=top_edit, base_version=2, user="tester")

    v1 = services.prompts.prefix_ids(system_text((BODY,)))
    block = console.meter.block_size
    assert block == 32

    at_end = tpl.diff(name=name, version_a=1, version_b=2)
    common = next(i for i, (a, b) in enumerate(zip(v1, services.prompts.prefix_ids(system_text((end_edit,)))))
                  if a != b)
    assert at_end.first_diff_token == common == 429
    assert at_end.num_tokens_a == len(v1) == 431
    assert at_end.shared_blocks == 429 // 32 == 13  # all 13 full blocks stay warm
    assert at_end.num_blocks_a == 13
    assert "+Rule 12: thank the customer." in at_end.text_diff

    at_top = tpl.diff(name=name, version_a=1, version_b=3)
    assert at_top.first_diff_token == 6  # inside the first block, so no block is shared
    assert at_top.shared_blocks == 0
    assert "+Be brief." in at_top.text_diff

    same = tpl.diff(name=name, version_a=2, version_b=2)
    assert same.first_diff_token is None and same.shared_blocks == same.num_blocks_a


def test_saving_on_a_stale_version_is_refused_and_overwrites_nothing(tpl, console, services):
    name = new_template(tpl)
    tpl.save(name=name, text=BODY + "\nA.", base_version=1,
                      user="alice")
    with pytest.raises(db_templates.StaleVersion, match="edited .* from version 1, but version 2 was saved since"):
        tpl.save(name=name, text=BODY + "\nB.", base_version=1,
                          user="bob")
    detail = tpl.detail(name)
    assert [(v.number, v.created_by, v.text[-2:]) for v in detail.versions] == [(1, "tester", "s."), (2, "alice", "A.")]


def test_deleting_a_parent_with_children_is_refused_and_deleted_templates_keep_history(tpl, console, services):
    parent = new_template(tpl)
    child = new_template(tpl, text="Category: tents.", parent=parent)
    with pytest.raises(db_templates.ParentHasChildren, match=f"'{parent}' is the parent of '{child}'"):
        tpl.delete(name=parent, user="tester")
    tpl.delete(name=child, user="tester")
    tpl.delete(name=parent, user="tester")
    assert parent not in [r.name for r in tpl.rows()]
    def deleted(s):
        from app.db.models import Template

        row = s.query(Template).filter_by(name=child).one()
        return row.deleted_at is not None, len(row.versions)

    assert services.db.run(deleted) == (True, 1)
    with pytest.raises(db_templates.TemplateExists, match="deleted template keeps its name"):
        new_template_named(tpl, child)


def new_template_named(tpl, name):
    tpl.create(name=name, text="x", user="tester")


def test_a_template_that_leaves_no_room_for_answers_is_refused_with_the_numbers(tpl, console, services):
    name = new_template(tpl)
    huge = "Rule: " + "answer politely and check the order number. " * 250
    with pytest.raises(TemplateTooLong) as refused:
        tpl.save(name=name, text=huge, base_version=1, user="t")
    n = len(services.prompts.prefix_ids(system_text((huge,))))
    assert refused.value.num_tokens == n == 3012
    message = str(refused.value)
    assert f"{n:,} tokens; with answers of up to 48 tokens that is {n + 48:,} > max_model_len 2,048" in message
    assert [v.number for v in tpl.detail(name).versions] == [1]


def test_preview_counts_tokens_and_blocks_and_warns_about_per_request_text(tpl, console, services):
    p = preview(meter=console.meter, name="x", chain=(BODY,))
    assert (p.num_tokens, p.num_blocks, p.uncached_tail_tokens) == (431, 13, 15)
    assert p.rendered.startswith("<|im_start|>system\nRule 0:") and p.rendered.endswith("<|im_end|>\n")
    assert p.warnings == () and p.too_long is None
    warnings = cache_hazards("Hello {customer_name}.\nPrices valid on 2026-05-01 until 18:00.\n今天的优惠")
    assert len(warnings) == 4
    assert warnings[0].startswith("line 1: '{customer_name}' looks like a placeholder")
    assert warnings[1].startswith("line 2: '2026-05-01' is a date")
    assert warnings[2].startswith("line 2: '18:00' is a clock time")
    assert warnings[3].startswith("line 3: '今天' refers to the current day")


def test_export_then_import_round_trips_the_template_files(tpl, console, services):
    name = new_template(tpl, text="Original text for export.")
    tpl.publish(name=name, version=1, user="tester")
    files = dict(tpl.export_files())
    content = files[f"{name}.txt"]
    assert content == f"name: {name}\nlanguage: zh\n---\nOriginal text for export.\n"
    changes = tpl.import_files([("a.txt", content.replace("Original", "Imported"))], user="tester")
    assert [(c.template, c.before_version, c.after_version) for c in changes] == [(name, 1, 2)]
    assert services.catalog.get(name).chain == ("Imported text for export.",)


def test_the_text_diff_puts_each_removed_and_added_line_on_a_line_of_its_own():
    # A version whose text has no final newline: its last removed line ran on into the first added one.
    assert text_diff("refunds", 1, 2, "Be kind.\nRule 1: refund in 7 days", "Be kind.\nRule 1: refund in 14 days") == (
        "--- refunds v1\n+++ refunds v2\n@@ -1,2 +1,2 @@\n Be kind.\n-Rule 1: refund in 7 days\n"
        "+Rule 1: refund in 14 days\n")
    assert text_diff("refunds", 1, 2, "a\nb\n", "a\nc") == (
        "--- refunds v1\n+++ refunds v2\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n")
    assert text_diff("refunds", 2, 2, "same", "same") == ""
