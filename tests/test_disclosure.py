"""The disclosure rule (core/disclosure.py) on known inputs: what waits, what is hidden, and when
everything may be shown again. The browser test (tests/test_trust_browser.py) checks every frame."""

from __future__ import annotations

from core.disclosure import HIDDEN, WAITING_COMMANDS, Disclosure, identifying_words


def words_of_vllm() -> set[str]:
    return identifying_words(name="vllm", label="vLLM", url="http://127.0.0.1:8001/v1",
                             model="smollm2-135m-instruct", display_label="vLLM")


def test_identifying_words_cover_name_label_model_and_address():
    assert words_of_vllm() == {"vllm", "vLLM", "smollm2-135m-instruct", "http://127.0.0.1:8001/v1", "127.0.0.1:8001"}
    embedded = identifying_words(name="llama_cpp", label="llama.cpp (embedded)",
                                 url="in-process: SmolLM2-135M-Instruct.Q4_1.gguf", model="SmolLM2-135M-Instruct.Q4_1")
    assert {"llama_cpp", "llama.cpp (embedded)", "SmolLM2-135M-Instruct.Q4_1.gguf"} <= embedded
    assert identifying_words(name="ab", label="") == set()  # too short to find without hitting ordinary words


def test_without_a_waiting_blind_round_everything_may_be_shown():
    rule = Disclosure()
    assert all(rule.refusal(command) is None for command in WAITING_COMMANDS)
    assert rule.health_shown() and rule.panel_allowed("compare")
    assert rule.screen("vLLM at http://127.0.0.1:8001/v1 is down") == "vLLM at http://127.0.0.1:8001/v1 is down"


def test_a_waiting_blind_round_holds_every_view_that_could_name_a_column():
    rule = Disclosure()
    rule.hide("round-1", words_of_vllm())
    for command in WAITING_COMMANDS:
        wait = rule.refusal(command)
        assert wait is not None and wait.key == "blind_wait" and wait.values["command"] == command
    assert rule.refusal("help") is None
    assert not rule.health_shown()
    assert not rule.panel_allowed("compare") and not rule.panel_allowed("blind")


def test_app_texts_are_screened_longest_word_first_whatever_the_case():
    rule = Disclosure()
    rule.hide("round-1", words_of_vllm())
    screened = rule.screen("VLLM at http://127.0.0.1:8001/v1: not reachable (vllm, smollm2-135m-instruct)")
    assert "vllm" not in screened.lower() and "127.0.0.1:8001" not in screened and "smollm2" not in screened
    assert screened.count(HIDDEN) == 4 and screened.endswith(")")
    assert screened == f"{HIDDEN} at {HIDDEN}: not reachable ({HIDDEN}, {HIDDEN})"


def test_the_vote_releases_only_its_own_round_and_the_words_never_print():
    rule = Disclosure()
    rule.hide("round-1", {"vllm"})
    rule.hide("round-2", {"tgi-server"})
    rule.hide("round-1", {"smollm2"})  # learned later (the plan's model id): merged
    assert "vllm" not in repr(rule) and "2 blind round" in repr(rule)
    rule.reveal("round-1")
    assert rule.screen("vllm smollm2 tgi-server") == f"vllm smollm2 {HIDDEN}"
    assert rule.refusal("stats") is not None
    rule.reveal("round-2")
    rule.reveal("round-2")  # twice is harmless
    assert rule.refusal("stats") is None and rule.waiting_rounds == 0


def test_a_chat_whose_rounds_cannot_be_read_is_held_as_if_one_waited():
    rule = Disclosure()
    rule.unsure = True  # reopened while the database was unavailable
    wait = rule.refusal("status")
    assert wait is not None and wait.key == "blind_wait_unsure"
    assert not rule.health_shown() and not rule.panel_allowed("compare")
    rule.unsure = False
    assert rule.refusal("status") is None
