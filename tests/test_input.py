"""What a typed message must be before it is sent (core/input.py): pure checks, plus why NUL goes.

The browser and protocol side (the same checks seen through the app, forged
websocket traffic, markup rendered as text) is tests/test_input_browser.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from core.texts import STRINGS, text
from core.input import (MAX_MESSAGE_CHARS, REFUSAL_KEY, check_client_step, check_message, refusal_of,
                        remove_control_characters)
from core.notices import Notice
from core.settings import SessionSettings, SettingsRejected, load_presets
from config import ChatDefaults

# Texts that must reach the backend exactly as typed.
INTACT = {
    "emoji": "Rate this 👍🏽 and 👨‍👩‍👧‍👦 (family, ZWJ) and 🇨🇳🇺🇸 flags",
    "right-to-left": "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "chinese": "请用中文写一段关于春天的短文。",
    "mixed": "Explain KV cache 缓存 in one sentence, then 用中文 again: 'prefix caching' 前缀缓存.",
    "combining and bidi marks": "e\u0301 n\u0303 \u200f\u202bembedded\u202c \u2066isolate\u2069 zero\u200bwidth \ufeffbom",
    "markup": '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> [click](javascript:alert(1))',
    "whitespace kept": "  leading and trailing spaces  \n\tindented line\r\nwindows line end\n",
    "DEL and C1 controls": "a\x7fb\x85c\x9fd",
    "astral plane": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁 🀄",
}


@pytest.mark.parametrize("sample", INTACT.values(), ids=INTACT.keys())
def test_everything_else_is_sent_character_for_character(sample):
    checked = check_message(sample)
    assert not checked.refused and checked.notices == ()
    assert checked.text_to_send == sample
    assert checked.text_to_send.encode("utf-8") == sample.encode("utf-8")


@pytest.mark.parametrize("raw", ["", " ", "\n\n\t  \r\n", "\u3000\u00a0", None, "\x00\x00", " \x07 \x1b "],
                         ids=["empty", "space", "whitespace", "ideographic and nbsp", "none", "only NUL",
                              "only controls"])
def test_empty_or_whitespace_is_refused(raw):
    checked = check_message(raw)
    assert checked.refused and checked.text_to_send is None
    assert checked.refusal.key == "input_empty"
    assert "Nothing was sent" in checked.refusal.render("en")


@pytest.mark.parametrize("raw", [42, 3.5, ["hi"], {"text": "hi"}, True])
def test_what_is_not_text_is_refused(raw):
    checked = check_message(raw)
    assert checked.refused and checked.refusal.key == "input_not_text"
    assert type(raw).__name__ in checked.refusal.render("en")


def test_a_message_over_the_limit_is_refused_with_its_length_and_the_limit():
    checked = check_message("x" * 200_000)
    assert checked.refused and checked.text_to_send is None
    shown = checked.refusal.render("en")
    assert "200,000 characters" in shown and f"{MAX_MESSAGE_CHARS:,}" in shown
    assert "stays in the chat" in shown
    assert "200,000" in checked.refusal.render("zh") and "上限" in checked.refusal.render("zh")


def test_the_limit_is_in_characters_and_inclusive():
    at_limit = "字" * MAX_MESSAGE_CHARS  # 3 bytes each in UTF-8: the limit counts characters
    assert check_message(at_limit).text_to_send == at_limit
    assert check_message(at_limit + "字").refusal.values == {"length": MAX_MESSAGE_CHARS + 1,
                                                            "limit": MAX_MESSAGE_CHARS}
    assert check_message("abc", limit_chars=2).refused


def test_control_characters_are_removed_with_a_count_tab_newline_cr_kept():
    raw = "a\x00b\x01c\td\ne\rf\x1bg\x0bh\x0ci\x1f"
    checked = check_message(raw)
    assert checked.text_to_send == "abc\td\ne\rfghi"
    (notice,) = checked.notices
    assert notice.key == "input_controls_removed" and notice.values == {"count": 6}
    assert "Removed 6 control character(s)" in notice.render("en")
    assert "6 个控制字符" in notice.render("zh")


def test_removed_controls_count_toward_nothing_but_the_rest_keeps_its_order():
    assert remove_control_characters("\x00天\x00空\x00") == ("天空", 3)
    assert remove_control_characters("plain") == ("plain", 0)


def test_an_unpaired_surrogate_is_replaced_so_the_text_can_be_encoded():
    # A JSON string may carry "\ud83d" alone (half an emoji); UTF-8 cannot encode it.
    raw = "half \ud83d emoji and a \ude00 tail, whole 😀"
    with pytest.raises(UnicodeEncodeError):
        raw.encode("utf-8")
    checked = check_message(raw)
    assert checked.text_to_send == "half \ufffd emoji and a \ufffd tail, whole 😀"
    checked.text_to_send.encode("utf-8")
    assert [n.key for n in checked.notices] == ["input_surrogates_replaced"]


def test_every_input_message_exists_in_both_languages():
    keys = [key for key in STRINGS["en"] if key.startswith("input_")]
    assert len(keys) == 5
    for key in keys:
        assert key in STRINGS["zh"], key
        text(key, "zh", count=1, length=2, limit=1, kind="int")


# ---------------------------------------------------------------- why NUL cannot stay


async def test_postgresql_stores_the_checked_text_and_marks_a_nul_the_check_never_saw(postgres_url):
    """PostgreSQL's text type has no NUL: a typed message is cleaned before it is sent (the NUL
    removed, the rest intact); a NUL that reaches the store another way (a model's reply) is stored
    as U+FFFD by the store's edge (store.faults.clean) instead of refused, and the reply lost."""
    from store import Store
    from store.urls import normalise_url
    from tests.fixtures_postgres import new_postgres_database
    from tests.test_store import make_reply

    store = await Store.open(normalise_url(await new_postgres_database(postgres_url)))
    try:
        await store.migrate()
        mixed = "\x00".join(INTACT.values())
        checked = check_message(mixed)
        await store.save_reply(dataclasses.replace(make_reply(thread_id="typed"), prompt=checked.text_to_send))
        await store.save_reply(dataclasses.replace(make_reply(thread_id="raw"), prompt="a\x00b"))
        assert [reply.prompt for reply in await store.replies_for_thread("typed")] == ["".join(INTACT.values())]
        assert [reply.prompt for reply in await store.replies_for_thread("raw")] == ["a\ufffdb"]
    finally:
        await store.aclose()


# ---------------------------------------------------------------- a message step as the browser sends it


def browser_step(**fields: object) -> dict:
    """A `client_message` step as the page builds it (load/chainlit_client.user_message), changed."""
    from load.chainlit_client import user_message

    return {**user_message("Hello", "http://127.0.0.1:8000/")["message"], **fields}


def test_a_browser_step_passes_with_its_own_fields_unchanged():
    step = browser_step(output="Hello 天空 👍")
    checked = check_client_step(step)
    assert checked.refusal is None
    assert {key: checked.step[key] for key in ("id", "name", "type", "output", "metadata")} == {
        "id": step["id"], "name": "User", "type": "user_message", "output": "Hello 天空 👍",
        "metadata": {"location": "http://127.0.0.1:8000/"}}


def test_forged_step_fields_of_every_wrong_type_are_dropped_before_anything_is_stored():
    step = browser_step(name=5, language={"a": 1}, modes=["x"], command=7, parentId=["p"], type="assistant_message",
                        isError=True, generation={"model": "forged"}, tags=["t"],
                        metadata={"location": "http://x/", "in_flight": {"process": 1}, "big": "y" * 100_000})
    checked = check_client_step(step).step
    assert checked["type"] == "user_message" and checked["metadata"] == {"location": "http://x/"}
    assert not {"name", "language", "modes", "command", "parentId", "isError", "generation", "tags"} & set(checked)


def test_step_fields_over_their_bounds_are_dropped_and_control_characters_removed():
    checked = check_client_step(browser_step(name="n" * 201, language="py\x00thon", modes={"m": "v" * 101},
                                             command="c" * 101)).step
    assert "name" not in checked and "modes" not in checked and "command" not in checked
    assert checked["language"] == "python"
    assert check_client_step(browser_step(modes={"chat": "fast"})).step["modes"] == {"chat": "fast"}


def test_a_text_over_the_limit_is_not_stored_and_its_refusal_reaches_the_handler():
    checked = check_client_step(browser_step(output="z" * 200_000))
    assert checked.step["output"] == ""
    assert refusal_of(checked.step["metadata"]) == checked.refusal == Notice(
        "input_too_long", {"length": 200_000, "limit": MAX_MESSAGE_CHARS})
    assert refusal_of(check_client_step(browser_step(output=["not", "text"])).step["metadata"]).key == "input_not_text"


def test_a_refusal_forged_in_the_metadata_does_not_survive_the_check():
    forged = {REFUSAL_KEY: {"key": "input_too_long", "values": {"length": 1, "limit": 0}}}
    checked = check_client_step(browser_step(metadata=forged))
    assert checked.refusal is None and refusal_of(checked.step["metadata"]) is None


@pytest.mark.parametrize("step", [None, "text", ["list"], {"output": "no id"}, {"id": 5, "output": "x"},
                                  {"id": "not-a-uuid", "output": "x"},
                                  {"id": "a8098c1a-f86e-11da-bd1a-00112444be1e", "output": "uuid1"}])
def test_what_is_not_a_message_step_is_dropped(step):
    assert check_client_step(step).step is None


# ---------------------------------------------------------------- settings forged over the websocket


@pytest.fixture
def form_defaults():
    return ChatDefaults(backend="llama_cpp"), ["llama_cpp", "paced"], load_presets()


def from_form(form_defaults, **values):
    defaults, backends, presets = form_defaults
    return SessionSettings.from_form(values, defaults, backends, presets)


def test_a_custom_system_prompt_with_control_characters_is_refused(form_defaults):
    with pytest.raises(SettingsRejected, match="2 control character"):
        from_form(form_defaults, system_custom="Be brief.\x00\x1b")
    assert from_form(form_defaults, system_custom="Be brief.\n\tTabs ok. 简洁 👍").system_custom.endswith("👍")


def test_forged_names_are_quoted_short_in_the_refusal(form_defaults):
    from backends.errors import UnknownBackend

    with pytest.raises(UnknownBackend) as refused:
        from_form(form_defaults, backend="http://127.0.0.1:9/v1" + "x" * 100_000)
    assert len(str(refused.value)) < 300 and "http://127.0.0.1:9/v1" in str(refused.value)
    with pytest.raises(SettingsRejected) as rejected:
        from_form(form_defaults, system_preset="p" * 100_000)
    assert len(str(rejected.value)) < 400


def test_settings_the_panel_does_not_have_are_refused(form_defaults):
    with pytest.raises(SettingsRejected, match="unknown setting.*base_url.*configuration"):
        from_form(form_defaults, backend="paced", base_url="http://127.0.0.1:9/v1", api_key="sk-forged")


# ---------------------------------------------------------------- which pages may open the socket


@pytest.mark.parametrize("origin, hosts, listed, allowed", [
    (None, ["lab:8000"], [], True),  # not a browser
    ("http://lab:8000", ["lab:8000"], [], True),  # the app's own page
    ("https://lab:8000", ["lab:8000"], [], True),  # behind TLS the app may not know its scheme
    ("http://LAB:8000", ["lab:8000"], [], True),
    ("http://lab:9000", ["lab:8000"], [], False),  # another port is another origin
    ("http://evil.example", ["lab:8000"], [], False),
    ("null", ["lab:8000"], [], False),  # sandboxed frames, file:// pages
    ("https://lab.school.edu", ["127.0.0.1:8000", "lab.school.edu"], [], True),  # X-Forwarded-Host
    ("https://lab.school.edu", ["127.0.0.1:8000"], ["https://lab.school.edu"], True),  # listed
    ("http://evil.example", ["lab:8000"], ["*"], True),  # Chainlit's default: every page
    ("http://evil.example, http://lab:8000", ["lab:8000"], [], False),  # one header added by a library
    ("http://lab:8000, http://lab:8000", ["lab:8000"], [], True),
])
def test_origin_allowed(origin, hosts, listed, allowed):
    from ui.socket_guard import origin_allowed

    assert origin_allowed(origin, hosts, listed) is allowed


def test_the_forwarded_host_counts_only_its_first_value():
    from ui.socket_guard import request_hosts

    assert request_hosts({"HTTP_HOST": "127.0.0.1:8000", "HTTP_X_FORWARDED_HOST": "lab.edu, proxy.internal"}) == [
        "127.0.0.1:8000", "lab.edu"]
    assert request_hosts({}) == [""]
