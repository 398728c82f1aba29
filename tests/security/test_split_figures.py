"""Attack: tell a split's arm from the chat's caption (issue 28).

Before: the caption said "reused N/M" with M the prompt's length, which differs between a split's versions, so a
customer (or a script rating answers) knew which arm each conversation was on. After: the caption says what share
of the conversation's own version's shared prefix came from the cache — "100%" on either arm once it is warm.
"""

from __future__ import annotations

import re

import pytest

from app import template_files
from app.core.catalog import TemplateCatalog
from app.core.prompts import system_text
from app.db import open_database
from app.db import templates as db_templates
from app.chat.text import caption_details
from tests.helpers.desks import desk_for
from tests.helpers.servers import collect, full_blocks

NO_CHECK = lambda *_: None  # noqa: E731
V2 = " ".join(["Policy: answer in one short sentence, then offer a person to talk to."] * 12)


@pytest.fixture()
def split_desk(services, tmp_path):
    """The session engine with a database of the test's own whose support-en runs a 50/50 split of v1 and v2."""
    db = open_database(f"sqlite:///{tmp_path / 'split.db'}")
    db.run(db_templates.seed, template_files.read_folder(services.settings.templates_dir))
    db.run(db_templates.save_version, name="support-en", text=V2, base_version=1, user="op", check_fits=NO_CHECK)
    db.run(db_templates.start_split, name="support-en", version=2, share=0.5, user="op", check_fits=NO_CHECK)
    catalog = TemplateCatalog(db, services.prompts)
    catalog.load()
    yield desk_for(services, db=db, catalog=catalog)
    db.close()


def reused(details: str) -> str:
    return re.search(r"已读资料复用 [^ ]+", details).group(0)


def test_the_caption_is_the_same_on_either_arm_of_a_split(split_desk, aio, services, block_size):
    catalog = split_desk.catalog
    published, candidate = catalog.get("support-en"), catalog.candidate("support-en")
    shared = {v.version_id: full_blocks(len(services.prompts.prefix_ids(system_text(v.chain))), block_size)
              for v in (published, candidate)}
    assert shared[published.version_id] != shared[candidate.version_id] and min(shared.values()) > 0

    finished = [aio(collect(split_desk.answer(session_key="split", client="192.0.2.80", template_name="support-en",
                                              message="Where is my parcel?", max_tokens=2, ignore_eos=True)))[-1]
                for _ in range(8)]
    by_arm: dict[int, list] = {}
    for f in finished:
        by_arm.setdefault(f.message.template_version_id, []).append(f)
    assert sorted(by_arm) == sorted(shared) and all(len(v) >= 2 for v in by_arm.values())
    # What the stored rows say differs by arm: the prompt's length (the old caption's M) ...
    assert len({f.message.prompt_tokens for f in finished}) == 2
    # ... and what a customer reads does not: each arm's warm answers reused all of their version's shared prefix.
    warm = [f for arm in by_arm.values() for f in arm[1:]]
    assert [f.customer.shared_tokens for f in warm] == [shared[f.message.template_version_id] for f in warm]
    assert {reused(caption_details(f.customer, "zh")) for f in warm} == {"已读资料复用 100%"}
    assert {reused(caption_details(f.customer, "en").replace("reading reused", "已读资料复用")) for f in warm} == {
        "已读资料复用 100%"}
    # The conversation as the chat reopens it says the same.
    again = aio(split_desk.conversation(session_key="split", conversation_id=warm[0].message.conversation_id))
    assert reused(caption_details(again[-1], "zh")) == "已读资料复用 100%"
