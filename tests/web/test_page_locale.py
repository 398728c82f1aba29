"""Gradio's own words follow the server's language, not the browser's (app/web/page_locale.py): both pages name
their locale in a script before Gradio's, and Gradio's Chinese is completed with the keys it lacks. The browser
walks that show it: tests/admin/test_console_language.py (every console tab, in the other language's browser) and
tests/web/test_chat_words.py (the chat page in en-US, fr-FR and zh-CN browsers)."""

import re

import httpx

from app.web.page_locale import GRADIO_ZH_CN_MISSING, translations
from tests.helpers.gradio_lang import words
from tests.helpers.servers import operator

CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
PLACEHOLDER = re.compile(r"\{\w+\}")
ACCOUNT = ("op-locale", "page locale walker 4")
SCRIPT = '<head><script>(()=>{const l="zh-CN";'


def test_gradios_chinese_is_completed_with_every_key_it_lacks_and_nothing_else():
    english, chinese = words("en"), words("zh-CN")
    assert len(english) == 159 and len(chinese) == 106  # Gradio 6.31's files, read whole
    assert english["chatbot.copy_message"] == "Copy message" and "chatbot.copy_message" not in chinese
    assert set(GRADIO_ZH_CN_MISSING) == set(english) - set(chinese)
    for key, text in GRADIO_ZH_CN_MISSING.items():
        assert CJK.search(text), key
        assert sorted(PLACEHOLDER.findall(text)) == sorted(PLACEHOLDER.findall(english[key])), key


def test_the_pages_own_words_go_over_the_chinese_gradio_lacks():
    own = {"en": {"chatbot.copy_message": "复制"}, "zh-CN": {"chatbot.copy_message": "复制"}}
    zh = translations("zh", own).translations_dict
    assert set(zh) == {"en", "zh-CN"}
    assert zh["zh-CN"]["chatbot.copy_message"] == "复制"  # the page's, over Gradio's missing "复制消息"
    assert zh["zh-CN"]["dataframe.filter"] == "筛选"
    assert len(zh["zh-CN"]) == len(GRADIO_ZH_CN_MISSING)
    assert zh["en"] == {"chatbot.copy_message": "复制"}
    assert translations("en").translations_dict == {"en": {}}  # named, so Gradio starts its words from the page's


def test_both_pages_name_their_locale_before_gradios_script(server_url, services):
    operator(services, *ACCOUNT)
    cookie = httpx.post(server_url + "admin/login", data={"username": ACCOUNT[0], "password": ACCOUNT[1]}).cookies
    for path, cookies in (("", None), ("admin/", cookie)):
        html = httpx.get(server_url + path, cookies=cookies).text
        assert html.count('const l="zh-CN"') == 1, path
        head = html[html.index("<head>"):]
        assert head.startswith(SCRIPT), path
        assert head.index(SCRIPT) < head.index("gradio_config") < head.index('type="module"'), path
    login = httpx.get(server_url + "admin/login").text  # the server's own page: no Gradio, no script
    assert "const l=" not in login
