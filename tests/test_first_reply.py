"""The newcomer check (load/first_reply.py) on known inputs: it passes a working first run and
names what is broken otherwise. CI runs it against the real app before any test tool exists."""

from __future__ import annotations

import json
from pathlib import Path

from core.texts import text
from load.chainlit_client import ReplyRecord
from load.first_reply import EMBEDDED_KIND_LABEL, backend_ready_in, final_figures, first_run_problems

RECORDING = Path(__file__).parent / "recordings" / "chainlit-2.12-llamacpp-queued.json"
READY = (f"{text('status_title', 'en')}\n- ✅ **{EMBEDDED_KIND_LABEL}** (`llama_cpp`, in-process): ready\n"
         f"- ❌ **vLLM** (`vllm`): unavailable: not reachable")
DOWN = f"{text('status_title', 'en')}\n- ❌ **{EMBEDDED_KIND_LABEL}** (`llama_cpp`): unavailable: no model"
FIGURES = {"state": "completed", "ttftMs": 310.2, "tokens": 21, "tokensExact": True, "backend": EMBEDDED_KIND_LABEL}


def replied(text_: str = "A language model predicts text.") -> ReplyRecord:
    return ReplyRecord(prompt="q", message_id="m", sent_at_s=0.0, completed_at_s=2.0, text=text_, outcome="replied")


def test_the_backend_list_must_mark_the_embedded_model_ready():
    assert backend_ready_in(READY)
    assert not backend_ready_in(DOWN)
    assert not backend_ready_in("")


def test_a_working_first_run_has_no_problem():
    assert first_run_problems(READY, READY, replied(), FIGURES) == []


def test_each_broken_part_is_named():
    problems = first_run_problems(DOWN, READY, replied(), FIGURES)
    assert len(problems) == 1 and "backend list" in problems[0]
    broken = ReplyRecord(prompt="q", message_id="m", sent_at_s=0.0, error="on_message failed: ImportError",
                         outcome="error")
    problems = first_run_problems(READY, DOWN, broken, None)
    assert [p.split(" ")[0] for p in problems] == ["/status", "no", "the"]
    assert "ImportError" in problems[1]
    stopped = {**FIGURES, "state": "stopped", "tokensExact": False}
    problems = first_run_problems(READY, READY, replied(), stopped)
    assert problems == ["the reply's figures say 'stopped', not completed",
                        "the reply's figures have no exact token count (21)"]


def test_final_figures_are_the_last_figures_element_of_a_recorded_reply():
    events = [(event["at_s"], event["event"], event["data"]) for event in json.loads(RECORDING.read_text())]
    figures = final_figures(events)
    assert figures["state"] == "completed" and figures["tokens"] >= 1 and figures["ttftMs"] > 0
    assert figures["backend"].startswith("llama.cpp")
