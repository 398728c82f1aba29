"""Every visible label of every console tab speaks the console's language: no English left in the zh console
(beyond product names and units), no Chinese in the en one — Gradio's own labels too, walked in a real browser
whose language is the *other* one (Gradio would follow the browser's: app/web/page_locale.py), with a screenshot
of every tab at both widths."""

import re

import pytest

from admin.i18n import TEXT
from tests.helpers.browser import CONSOLE_TABS, DESKTOP, PHONE, admin_page, open_tab, screenshot
from tests.helpers.servers import SecondServer, operator

# Words a zh console may show in Latin letters: the product, vLLM's names and units everyone uses untranslated.
ALLOWED = {"prefixdesk", "vLLM", "KV", "TTFT", "ms", "GPU", "CPU", "CSV", "JSONL", "token", "LRU", "RSS", "MiB", "GiB",
           "UTC", "p50", "p10", "p90", "cache_salt", "ZMQ"}
SETTING = re.compile(r"^PREFIXDESK_[A-Z_]+(=\w+)?$")
# Data, not labels: what customers and operators wrote (template names and texts, answers), values in inputs.
DATA = ["input", "textarea", "select", "code", "pre", "svg", "canvas", "[role=listbox]", "#cache-tree b",
        "#template-info", "#conv-headline", "#conv-transcript", "#ver-split", "#demo-cold", "#demo-warm",
        "#preview", "#pd-user strong", ".pd-replica",
        ".sr-only"]  # not drawn: Gradio's screen-reader status, which says its untranslated key "common.complete"
TEXTS_JS = """(data) => {
  const skip = (el) => {
    if (el.closest(data.join(','))) return true;
    for (let a = el; a; a = a.parentElement) if (/^cell-\\d+-\\d+$/.test(a.dataset?.testid || '')) return true;
    return false;
  };
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const el = node.parentElement;
    if (!text || !el || skip(el)) continue;
    if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    out.push(text);
  }
  for (const el of document.querySelectorAll('[placeholder]')) {  // what an empty box says it is for
    if (el.checkVisibility() && el.getAttribute('placeholder')) out.push(el.getAttribute('placeholder'));
  }
  return out;
}"""
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")


@pytest.fixture(scope="module")
def english(services, engine_loop, tmp_path_factory):
    with SecondServer(services, engine_loop, tmp_path_factory.mktemp("language-en"), ui_language="en",
                      admin_password="english walker 31") as url:
        yield url, ("admin", "english walker 31")


def foreign(texts: list[str], language: str) -> list[str]:
    """The texts that are (partly) in the other language."""
    if language == "en":
        return sorted({t for t in texts if CJK.search(t)})
    wrong = set()
    for text in texts:
        for word in re.findall(r"[A-Za-z][A-Za-z0-9_=]*", text):
            if len(word) > 1 and word not in ALLOWED and not SETTING.match(word) and not re.fullmatch(r"v\d+", word):
                wrong.add(text)
    return sorted(wrong)


@pytest.mark.parametrize("language", ["zh", "en"])
def test_every_tab_speaks_the_consoles_language_only(browser, request, server_url, services, language):
    if language == "zh":
        url, login = server_url, operator(services, "op-walker", "walk every label 8")
    else:
        url, login = request.getfixturevalue("english")
    page = admin_page(browser, url, login, **DESKTOP, locale="en-US" if language == "zh" else "zh-CN")
    assert page.evaluate("document.documentElement.lang") == {"zh": "zh-CN", "en": "en"}[language]
    found = {}
    for tab in CONSOLE_TABS:
        open_tab(page, tab, language)
        page.wait_for_timeout(800)  # the tab's load handlers fill its labels
        texts = page.evaluate(TEXTS_JS, DATA)
        assert texts, tab
        if wrong := foreign(texts, language):
            found[tab] = wrong
        screenshot(page, f"console-{language}-{tab}")
    assert found == {}, found
    page.set_viewport_size(PHONE)
    for tab in CONSOLE_TABS:
        open_tab(page, tab, language)
        page.wait_for_timeout(300)
        screenshot(page, f"console-{language}-{tab}")
    page.close()


def test_the_walk_finds_text_of_the_other_language():
    # The check itself can fail: English in zh, Chinese in en, and the allowed words pass.
    assert foreign(["运行中请求占用", "首 token 中位数 (ms)", "PREFIXDESK_KV_EVENTS=false", "v2 获得 50%"], "zh") == []
    assert foreign(["Search", "搜索"], "zh") == ["Search"]
    assert foreign(["Search", "搜索"], "en") == ["搜索"]


def test_a_stale_save_and_a_parents_delete_are_refused_in_the_consoles_language():
    from admin.i18n import refusal
    from app.db.templates import ParentHasChildren, StaleVersion

    stale, parent = StaleVersion("售后", 1, 2), ParentHasChildren("售后", ["售后-手机", "售后-家电"])
    assert refusal("zh", stale) == ("冲突：您是在版本 1 的基础上修改 '售后' 的，但之后已经保存了版本 2。"
                                    "没有覆盖任何内容；请重新载入版本 2，再做一次修改后保存。")
    assert refusal("zh", parent) == "'售后' 是 '售后-手机'、'售后-家电' 的父模板；请先删除或重新创建这些模板。"
    assert refusal("en", stale) == str(stale)  # the English words are the exception's own
    assert refusal("en", parent) == str(parent) == (
        "'售后' is the parent of '售后-手机', '售后-家电'; delete or re-create those first.")
    assert refusal("zh", ValueError("other")) is None


def test_the_previews_warnings_speak_the_consoles_language():
    from admin.i18n import hazard_text
    from admin.preview import cache_hazards, hazards

    text = "Hello {customer_name}.\n今天的优惠"
    zh = [hazard_text(TEXT["zh"], h) for h in hazards(text)]
    assert zh == ["第 1 行：'{customer_name}' 像是占位符；如果每次请求都填入不同内容，前缀就会变化，它之后的内容都无法缓存。"
                  "请把每位客户的信息放在用户消息里。",
                  "第 2 行：'今天' 指当天或当前时间；写这种话的文本通常每次请求都会更新，会破坏缓存。"]
    assert [hazard_text(TEXT["en"], h) for h in hazards(text)] == list(cache_hazards(text))  # the same English


def test_a_topics_title_and_questions_are_refused_in_the_consoles_language():
    from app import template_files
    from admin.i18n import refusal
    from app.db.templates import PresentationRefused

    def refused(title: str, questions: list[str]) -> PresentationRefused:
        with pytest.raises(template_files.PresentationError) as caught:
            template_files.check_presentation(title, questions)
        return PresentationRefused(caught.value)

    refusals = [refused("", [f"问题{i}" for i in range(5)]), refused("长" * 61, []), refused("a\nb", []),
                refused("", ["a\tb"]), refused("", ["问" * 1201])]
    assert [refusal("zh", exc) for exc in refusals] == [
        "共 5 个推荐问题；空白对话最多显示 4 个。请只保留最好的几个。", "标题有 61 个字，话题选择框最多放得下 60 个字。请缩短。",
        "标题只能是一行文字，不能有换行或控制字符。", "每个推荐问题只能是一行文字，不能有换行或控制字符。",
        "有个推荐问题有 1,201 个字，最多 200 个字。请缩短。"]
    assert [refusal("en", exc) for exc in refusals] == [str(exc) for exc in refusals]  # the English as it was
    assert str(refusals[0]) == "5 suggested questions; an empty chat shows at most 4. Keep the best ones."
