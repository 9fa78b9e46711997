"""The chat UI in a real browser (Debian's chromium through Playwright).

The app runs as a user starts it (`chainlit run app.py --headless`) with three
backends: the embedded llama.cpp model (default), the paced OpenAI-protocol
test server (kind "openai") and an OpenAI-compatible backend on a loopback
port nothing listens on. Each test opens a fresh chat session.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from servers.app import AppServer, backend_env
from servers.paced_openai import PacedServer
from tests.fixtures_app import closed_loopback_url, stored_when

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LLAMA_LABEL = "llama.cpp (embedded)"
PACED_LABEL = "Paced test server"
DOWN_LABEL = "Down server"
PACED_MODEL = "paced-test-model"
# The embedded model decodes 20-60 tokens/s on 2 shared cores; replies are kept short
# and waits generous so a loaded machine is slow, not red.
REPLY_TIMEOUT_MS = 180_000
SESSION_READY_TIMEOUT_MS = 120_000
MAX_NEW_TOKENS = 64

# One snapshot of a reply (found by its step id) or, without an id, of the newest
# reply that carries a metrics element.
SNAPSHOT_JS = """
(stepId) => {
  let step = null;
  if (stepId) {
    const inner = document.getElementById(stepId);
    step = inner ? inner.closest('.step') : null;
  } else {
    const steps = [...document.querySelectorAll('.step[data-step-type="assistant_message"]')]
      .filter((s) => s.querySelector('[data-testid="metrics"]'));
    step = steps.length ? steps[steps.length - 1] : null;
  }
  if (!step) return null;
  const metrics = step.querySelector('[data-testid="metrics"]');
  const value = (id) => {
    const cell = metrics && metrics.querySelector(`[data-testid="${id}"]`);
    if (!cell) return null;
    const mono = cell.querySelector('.font-mono');
    return (mono || cell).innerText.trim();
  };
  const prose = step.querySelector('.message-content .prose');
  return {
    stepId: step.querySelector('[id^="step-"]').id,
    author: (step.querySelector('img[alt^="Avatar for "]') || {alt: ""}).alt.replace("Avatar for ", ""),
    state: metrics ? metrics.dataset.state : null,
    status: value('metrics-status'),
    backend: value('metrics-backend'),
    model: value('metrics-model'),
    ttft: value('metrics-ttft'),
    rate: value('metrics-rate'),
    tokens: value('metrics-tokens'),
    elapsed: value('metrics-elapsed'),
    tpot: value('metrics-tpot'),
    text: prose ? prose.innerText : "",
  };
}
"""


# ---------------------------------------------------------------- helpers


def duration_ms(shown: str | None) -> float | None:
    """'959 ms' -> 959; '1.35 s' -> 1350; '–' -> None."""
    match = re.fullmatch(r"([\d.]+)\s*(ms|s)", shown or "")
    if not match:
        return None
    return float(match.group(1)) * (1000.0 if match.group(2) == "s" else 1.0)


def number(shown: str | None) -> float | None:
    match = re.match(r"[\d.]+", shown or "")
    return float(match.group(0)) if match else None


def open_chat(page: Page, app: AppServer) -> None:
    """Open a new session and wait until on_chat_start is done (the backend status list is shown)."""
    page.goto(app.url)
    # The status list names every backend's model; the paced server's is unique and language-neutral.
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text=PACED_MODEL)).to_be_visible(
        timeout=SESSION_READY_TIMEOUT_MS)


def switch_backend(page: Page, option_name: str, label: str) -> None:
    """Choose a backend in the settings panel and confirm."""
    page.locator("#chat-settings-open-modal").click()
    page.locator("#backend").click()
    page.get_by_role("option", name=option_name).click()
    page.locator("#confirm").click()
    # Applying settings may probe the backend first (up to its status timeout): on a busy 2-core
    # machine Playwright's default 5 s wait is too short for a notice that is not a measured figure.
    expect(page.locator(".step", has_text=f"from your next message: {label}").last).to_be_visible(timeout=30_000)


def send(page: Page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()


def new_reply_id(page: Page, previous_id: str | None, timeout_s: float = 60.0) -> str:
    """The step id of the reply that appears after `previous_id`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = page.evaluate(SNAPSHOT_JS, None)
        if snapshot and snapshot["stepId"] != previous_id:
            return snapshot["stepId"]
        time.sleep(0.05)
    raise AssertionError("no new reply with figures appeared")


def latest_reply_id(page: Page) -> str | None:
    snapshot = page.evaluate(SNAPSHOT_JS, None)
    return snapshot["stepId"] if snapshot else None


def watch_reply(page: Page, step_id: str, *, until: tuple[str, ...] = ("completed", "stopped", "error"),
                timeout_ms: float = REPLY_TIMEOUT_MS, poll_s: float = 0.05) -> list[dict]:
    """Snapshots of one reply every poll_s until its figures reach a final state; the last is final."""
    snapshots: list[dict] = []
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        snapshot = page.evaluate(SNAPSHOT_JS, step_id)
        if snapshot is not None:
            snapshots.append(snapshot)
            if snapshot["state"] in until:
                return snapshots
        time.sleep(poll_s)
    raise AssertionError(f"reply {step_id} did not finish; last seen: {snapshots[-1:]}")


def last_paced_request(server: PacedServer) -> dict:
    requests = server.requests()
    assert requests, "the paced server received no request"
    return requests[-1]


def assert_final_figures(final: dict, *, backend: str, model_part: str) -> None:
    assert final["state"] == "completed", final
    assert duration_ms(final["ttft"]) is not None and duration_ms(final["ttft"]) > 0, final
    assert number(final["rate"]) is not None and number(final["rate"]) > 0, final
    assert number(final["tokens"]) is not None and number(final["tokens"]) >= 2, final
    assert duration_ms(final["elapsed"]) >= duration_ms(final["ttft"]), final
    assert number(final["tpot"]) is not None, final
    assert final["backend"] == backend, final
    assert model_part in (final["model"] or ""), final


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def down_url() -> str:
    return closed_loopback_url()


@pytest.fixture(scope="module")
def lab_app(app_factory, paced_server: PacedServer, down_url: str) -> AppServer:
    env = {
        "BACKENDS": "llama_cpp,paced,down",
        "DEFAULT_BACKEND": "llama_cpp",
        "DEFAULT_MAX_NEW_TOKENS": str(MAX_NEW_TOKENS),
        "DEFAULT_TEMPERATURE": "0",
        "DEFAULT_SYSTEM_PROMPT": "none",
        **backend_env("paced", kind="openai", base_url=paced_server.base_url, label=PACED_LABEL),
        **backend_env("down", kind="openai", base_url=down_url, label=DOWN_LABEL, connect_timeout_s="2"),
    }
    return app_factory(env, name="chainlit-browser-tests")


# ---------------------------------------------------------------- tests


def test_reply_streams_with_live_figures_then_final(page: Page, lab_app: AppServer):
    open_chat(page, lab_app)
    send(page, "Write a long story about a robot who learns to paint.")
    step_id = new_reply_id(page, None)
    snapshots = watch_reply(page, step_id)

    final = snapshots[-1]
    live = [s for s in snapshots if s["state"] == "streaming" and number(s["tokens"])]
    readings = {(s["tokens"], s["elapsed"]) for s in live}
    # The figures refresh ~10 times a second: here (tens of tokens/s) the stream lasts seconds and
    # shows many readings; a machine fast enough to stream the whole reply in a blink shows fewer,
    # so the count asked for follows the stream's own length (the paced test below holds the pace).
    stream_ms = duration_ms(final["elapsed"]) - duration_ms(final["ttft"])
    expected = max(1, min(3, int(stream_ms // 250)))
    assert len(readings) >= expected, f"a {stream_ms:.0f} ms stream showed only {readings}"
    tokens_seen = [number(s["tokens"]) for s in live]
    assert tokens_seen == sorted(tokens_seen) and (expected == 1 or tokens_seen[-1] > tokens_seen[0]), tokens_seen
    elapsed_seen = [duration_ms(s["elapsed"]) for s in live]
    assert elapsed_seen == sorted(elapsed_seen) and (expected == 1 or elapsed_seen[-1] > elapsed_seen[0])
    assert any(0 < len(s["text"]) < len(final["text"]) for s in live), "the text did not stream"

    assert_final_figures(final, backend=LLAMA_LABEL, model_part="SmolLM2")
    assert final["status"] == "done"
    assert final["text"].strip()
    assert number(final["tokens"]) >= tokens_seen[-1]


def test_live_ttft_and_tokens_per_s_follow_the_stream_then_show_the_exact_final_figures(
    page: Page, lab_app: AppServer, paced_server: PacedServer
):
    # 1 s to the first token, then 20 tokens/s with a 1.5 s pause after token 20: the live TTFT goes
    # from "–" to about 1 s, and the live tokens/s (tokens over the decode time so far, as the final
    # figure) first reads about 20, then falls when the first token after the pause arrives.
    paced_server.set_pace(rate_tokens_per_s=20, tokens=40, first_token_s=1.0)
    paced_server.set_faults(stall_after_tokens=20, stall_s=1.5)
    try:
        open_chat(page, lab_app)
        switch_backend(page, f"{PACED_LABEL} (paced)", PACED_LABEL)
        send(page, "Pace yourself.")
        step_id = new_reply_id(page, None)
        snapshots = watch_reply(page, step_id)
    finally:
        paced_server.set_faults(stall_after_tokens=None, stall_s=0)
    final = snapshots[-1]
    assert_final_figures(final, backend=PACED_LABEL, model_part=PACED_MODEL)

    waiting = [s for s in snapshots if s["state"] != "completed" and not number(s["tokens"])]
    streaming = [s for s in snapshots if s["state"] == "streaming" and number(s["tokens"])]
    assert waiting and all(duration_ms(s["ttft"]) is None for s in waiting), waiting[-1:]
    live_ttft = {duration_ms(s["ttft"]) for s in streaming}
    assert len(live_ttft) == 1 and None not in live_ttft, live_ttft  # known at the first token, then fixed
    (ttft_ms,) = live_ttft
    assert 900 <= ttft_ms < 5000, ttft_ms
    assert duration_ms(final["ttft"]) == pytest.approx(ttft_ms, abs=1.0)  # the same measurement, final

    rates = [(number(s["tokens"]), number(s["rate"])) for s in streaming if number(s["rate"])]
    before_pause = [rate for tokens, rate in rates if 5 <= tokens <= 20]
    after_pause = [rate for tokens, rate in rates if tokens > 20]
    assert before_pause and after_pause, rates
    assert len({rate for _, rate in rates}) >= 3, rates  # the value itself moves while streaming
    assert max(before_pause) > 12, rates  # about 20 tokens/s before the pause (generous: a busy machine)
    assert after_pause[0] < max(before_pause) * 0.75, rates  # the pause shows at the first token after it
    # The final figures against the server's own record of what it sent: exactly its 40 tokens, and
    # the whole reply's rate (39 gaps over ~1.95 s of pacing plus the 1.5 s pause) as the server's
    # own send times give it, within 10% (the browser lags the server by ~15 ms at the last token).
    sent = paced_server.requests()[-1]
    assert sent["tokens_sent"] == 40 and sent["completed"], sent
    assert number(final["tokens"]) == 40, final
    true_rate = 39 / (sent["last_token_sent_at_s"] - sent["first_token_sent_at_s"])
    assert number(final["rate"]) == pytest.approx(true_rate, rel=0.1), (final, true_rate)


def test_switching_backend_applies_to_the_next_reply(page: Page, lab_app: AppServer, paced_server: PacedServer):
    paced_server.set_pace(rate_tokens_per_s=40, tokens=40)
    open_chat(page, lab_app)
    switch_backend(page, f"{PACED_LABEL} (paced)", PACED_LABEL)
    send(page, "Which server answers this?")
    step_id = new_reply_id(page, None)
    final = watch_reply(page, step_id)[-1]

    request = last_paced_request(paced_server)
    assert request["last_user_text"] == "Which server answers this?"
    assert final["text"].split() == ["w%d" % i for i in range(1, 40)] + [request["marker"]]
    assert_final_figures(final, backend=PACED_LABEL, model_part=PACED_MODEL)
    # The server's usage (include_usage) makes the count exact: no "≈" mark.
    assert final["tokens"] == "40"
    assert final["author"] == PACED_LABEL


def test_unreachable_backend_shows_error_then_the_chat_goes_on(
    page: Page, lab_app: AppServer, paced_server: PacedServer, down_url: str
):
    paced_server.set_pace(rate_tokens_per_s=50, tokens=20)
    open_chat(page, lab_app)
    switch_backend(page, f"{DOWN_LABEL} (down)", DOWN_LABEL)
    user_text = "Please remember the number 4711."
    send(page, user_text)

    error = page.locator(".step", has_text=f"{DOWN_LABEL} could not answer")
    expect(error).to_be_visible(timeout=30_000)
    expect(error).to_contain_text(down_url)
    expect(error).to_contain_text("not reachable")
    expect(page.locator('.step[data-step-type="user_message"]', has_text=user_text)).to_be_visible()
    requests_before = len(paced_server.requests())

    # Switch to a working backend and press Retry: the same text is sent there.
    switch_backend(page, f"{PACED_LABEL} (paced)", PACED_LABEL)
    error.get_by_role("button", name="Retry").click()
    final = watch_reply(page, new_reply_id(page, None))[-1]
    assert final["state"] == "completed" and final["backend"] == PACED_LABEL, final
    retried = last_paced_request(paced_server)
    assert len(paced_server.requests()) == requests_before + 1
    assert retried["last_user_text"] == user_text
    assert final["text"].split()[-1] == retried["marker"]

    # And the next message works as usual.
    previous_id = final["stepId"]
    send(page, "And now?")
    final = watch_reply(page, new_reply_id(page, previous_id))[-1]
    assert final["state"] == "completed", final
    assert last_paced_request(paced_server)["last_user_text"] == "And now?"


def test_stop_keeps_partial_reply_and_marks_figures_stopped(
    page: Page, lab_app: AppServer, paced_server: PacedServer
):
    paced_server.set_pace(rate_tokens_per_s=10, tokens=300)  # 30 s if nobody stops it
    open_chat(page, lab_app)
    switch_backend(page, f"{PACED_LABEL} (paced)", PACED_LABEL)
    send(page, "Tell me everything.")
    step_id = new_reply_id(page, None)
    watch_reply(page, step_id, until=("streaming",))
    deadline = time.monotonic() + 30
    while len(page.evaluate(SNAPSHOT_JS, step_id)["text"].split()) < 5:
        assert time.monotonic() < deadline, "the reply did not start streaming"
        time.sleep(0.05)
    page.locator("#stop-button").click()
    final = watch_reply(page, step_id)[-1]

    assert final["state"] == "stopped", final
    words = final["text"].split()
    assert words and words == ["w%d" % i for i in range(1, len(words) + 1)], words
    request = last_paced_request(paced_server)
    assert request["marker"] not in final["text"]
    # Stop closed the HTTP stream: the server saw the client go.
    deadline = time.monotonic() + 10
    while not request["closed_by_client"]:
        assert time.monotonic() < deadline, request
        time.sleep(0.2)
        request = last_paced_request(paced_server)
    assert request["tokens_sent"] < 300
    time.sleep(1.0)
    later = page.evaluate(SNAPSHOT_JS, step_id)
    assert later["text"] == final["text"] and later["state"] == "stopped", "the reply went on after Stop"
    assert number(final["tokens"]) is not None and number(final["tokens"]) >= len(words) - 1


def test_chinese_reply_streams_without_broken_characters(chromium, lab_app: AppServer):
    context = chromium.new_context(locale="zh-CN", viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        open_chat(page, lab_app)
        send(page, "请用中文写一段关于春天的短文。")
        step_id = new_reply_id(page, None)
        snapshots = watch_reply(page, step_id)
        final = snapshots[-1]
        assert final["state"] == "completed", final
        assert final["text"].strip()
        broken = [s["text"] for s in snapshots if "\ufffd" in s["text"]]
        assert not broken, f"U+FFFD shown while streaming: {broken[:1]}"
        # The figures speak the browser's language.
        assert final["status"] == "完成", final
        expect(page.locator(f'#{step_id} [data-testid="metrics-ttft"]')).to_contain_text("首 token 时间")
    finally:
        context.close()


@pytest.fixture(scope="module")
def small_context_app(app_factory) -> AppServer:
    """The embedded model with a 192-token context, so two long messages cannot both fit."""
    env = {
        "BACKENDS": "llama_cpp",
        "LLAMA_CPP_N_CTX": "192",
        "DEFAULT_MAX_NEW_TOKENS": "16",
        "DEFAULT_TEMPERATURE": "0",
        "DEFAULT_SYSTEM_PROMPT": "none",
    }
    return app_factory(env, name="chainlit-small-context")


def test_history_longer_than_the_context_is_trimmed_with_a_visible_note(page: Page, small_context_app: AppServer):
    page.goto(small_context_app.url)
    expect(page.locator(".step", has_text="context 192 tokens")).to_be_visible(timeout=SESSION_READY_TIMEOUT_MS)
    long_text = "Please remember these words: " + " ".join(f"apple{i}" for i in range(40))
    send(page, long_text)
    first = new_reply_id(page, None)
    assert watch_reply(page, first)[-1]["state"] == "completed"
    expect(page.locator(".step", has_text="Trimmed")).to_have_count(0)

    send(page, long_text.replace("apple", "pear"))
    second = new_reply_id(page, first)
    final = watch_reply(page, second)[-1]
    assert final["state"] == "completed", final  # trimmed, not rejected by the backend
    note = page.locator(".step", has_text="Trimmed 2 earlier message(s)")
    expect(note).to_be_visible()
    expect(note).to_contain_text("context of 192 tokens")


@pytest.fixture(scope="module")
def tgi_app(app_factory, tgi_server) -> AppServer:
    """The app on the TGI-protocol test server (native route), nothing else."""
    env = {
        "BACKENDS": "tgi",
        "TGI_BASE_URL": tgi_server.url,
        "TGI_ROUTE": "generate",
        "DEFAULT_MAX_NEW_TOKENS": "48",
        "DEFAULT_SYSTEM_PROMPT": "none",
    }
    return app_factory(env, name="chainlit-tgi")


def test_tgi_error_inside_the_stream_reaches_the_user_clearly(page: Page, tgi_app: AppServer, tgi_server):
    import json
    import urllib.request

    page.goto(tgi_app.url)
    expect(page.locator(".step", has_text=tgi_server.model_id)).to_be_visible(timeout=SESSION_READY_TIMEOUT_MS)
    # The next generation fails after 5 tokens with an error event, as TGI reports a generation error.
    arm = urllib.request.Request(f"{tgi_server.url}/__test__/faults", method="POST",
                                 data=json.dumps({"fail_after_tokens": 5, "error_type": "generation"}).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(arm, timeout=10).close()

    send(page, "Tell me about rivers.")
    reply = new_reply_id(page, None)
    final = watch_reply(page, reply)[-1]
    assert final["state"] == "error", final
    assert final["text"].strip(), "the text streamed before the error stays"
    error = page.locator(".step", has_text="could not answer").last
    expect(error).to_contain_text("TGI")
    expect(error).to_contain_text(tgi_server.url)
    expect(error).to_contain_text("generation")

    send(page, "Tell me about lakes.")  # the session goes on
    following = new_reply_id(page, reply)
    assert watch_reply(page, following)[-1]["state"] == "completed"


# ---------------------------------------------------------------- the reply's timeline


def record_frames(page: Page) -> list[dict]:
    """Every Chainlit step the server sends over the websocket (new_message / update_message)."""
    import json

    steps: list[dict] = []

    def on_frame(payload) -> None:
        text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
        if not text.startswith("42"):
            return
        try:
            event, data = json.loads(text[2:])[:2]
        except (ValueError, TypeError):
            return
        if event in ("new_message", "update_message") and isinstance(data, dict):
            steps.append(data)

    page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
    return steps


def stored_record(steps: list[dict], step_id: str) -> dict:
    """The reply's record as the server stored it on the message (its metadata)."""
    for step in reversed(steps):
        if f"step-{step.get('id')}" == step_id and (step.get("metadata") or {}).get("record"):
            return step["metadata"]["record"]
    raise AssertionError(f"no stored record for {step_id}")


def shown_ms(page: Page, step_id: str, testid: str) -> float:
    cell = page.locator(f'#{step_id} [data-testid="{testid}"] .font-mono').first
    return duration_ms(cell.inner_text().split(" · ")[0])


def test_finished_reply_opens_its_timeline_with_the_gap_chart_and_the_stored_figures(
    page: Page, lab_app: AppServer, paced_server: PacedServer
):
    paced_server.set_pace(rate_tokens_per_s=50, tokens=40, first_token_s=0.05)
    steps = record_frames(page)
    open_chat(page, lab_app)
    switch_backend(page, f"{PACED_LABEL} (paced)", PACED_LABEL)
    send(page, "Show me your timeline.")
    step_id = new_reply_id(page, None)
    final = watch_reply(page, step_id)[-1]
    assert final["state"] == "completed", final

    toggle = page.locator(f'#{step_id} [data-testid="metrics-timeline-toggle"]')
    expect(page.locator(f'#{step_id} [data-testid="metrics-timeline"]')).to_have_count(0)
    toggle.click()
    timeline = page.locator(f'#{step_id} [data-testid="metrics-timeline"]')
    expect(timeline).to_be_visible()
    chart = timeline.locator('[data-testid="metrics-gap-chart"]')
    expect(chart).to_be_visible()
    expect(chart.locator("rect")).to_have_count(39)  # one bar per gap between 40 token chunks

    record = stored_record(steps, step_id)
    itl = record["itl"]
    assert itl["count"] == 39
    # What the element shows is the stored record's figures: the props carry them rounded to 0.1 ms
    # (core/figures.py) and the display rounds those to 1 ms (0.1 ms under 10 ms), so a shown value
    # is within 0.05 + 0.5 ms of the record's (71.468 -> 71.5 -> "72 ms" was seen).
    SHOWN_ABS_MS = 0.55
    for testid, key in (("itl-median", "median_ms"), ("itl-p90", "p90_ms"), ("itl-p99", "p99_ms"),
                        ("itl-max", "max_ms")):
        assert shown_ms(page, step_id, testid) == pytest.approx(itl[key], abs=SHOWN_ABS_MS), (testid, itl, page.locator(f"#{step_id} [data-testid=\"metrics-timeline\"]").inner_text())
    first_token = timeline.locator('[data-testid="timeline-first-token"] .font-mono').inner_text()
    assert duration_ms(first_token) == pytest.approx(record["first_token_s"] * 1000, abs=SHOWN_ABS_MS)
    first_byte = timeline.locator('[data-testid="timeline-first-byte"] .font-mono').inner_text()
    assert duration_ms(first_byte) == pytest.approx(record["first_byte_s"] * 1000, abs=SHOWN_ABS_MS)
    # The first mark is the request leaving: time 0 of the reply's clock.
    request_sent = timeline.locator('[data-testid="timeline-request-sent"]')
    expect(request_sent).to_contain_text("request sent")
    assert duration_ms(request_sent.locator(".font-mono").inner_text()) == 0.0
    assert timeline.locator('[data-testid^="timeline-"]').first.get_attribute("data-testid") == "timeline-request-sent"
    # The database keeps the same record for this reply, with its per-chunk timeline (the
    # message's metadata carries the figures only: a timeline per message would grow memory).
    assert "chunk_times_s" not in record
    (reply,) = [r for r in stored_when(lab_app.env["DATABASE_URL"], "replies", 50,
                                       until=lambda rs: any(r.prompt == "Show me your timeline." for r in rs))
                if r.prompt == "Show me your timeline."]
    assert reply.record["itl"] == itl and reply.first_token_s == record["first_token_s"]
    assert reply.output_tokens == 40 and len(reply.record["chunk_times_s"]) == 40
    # The record's percentiles are those of its own per-chunk times, and its median the server's pace.
    times = reply.record["chunk_times_s"]
    gaps_ms = [1000 * (b - a) for a, b in zip(times, times[1:])]
    import numpy

    assert itl["p90_ms"] == pytest.approx(numpy.percentile(gaps_ms, 90))
    # (How close the median comes to the server's 20 ms pace is a speed goal: experiments/measurement_parity.py.)
    assert itl["median_ms"] == pytest.approx(numpy.median(gaps_ms))
    # The server's own count sits beside ours, named by its source.
    expect(timeline.locator('[data-testid="metrics-server"]')).to_contain_text(f"{PACED_LABEL} usage")
    expect(timeline.locator('[data-testid="metrics-sent"]')).to_contain_text("temperature=0")


def test_a_setting_the_engine_cannot_honour_is_noted_next_to_the_reply(
    page: Page, lab_app: AppServer, paced_server: PacedServer
):
    paced_server.set_pace(rate_tokens_per_s=100, tokens=10)
    open_chat(page, lab_app)
    page.locator("#chat-settings-open-modal").click()
    page.locator("#backend").click()
    page.get_by_role("option", name=f"{PACED_LABEL} (paced)").click()
    page.locator("#top_k").fill("20")
    page.locator("#seed").fill("7")
    page.locator("#confirm").click()
    expect(page.locator(".step", has_text="optional settings: top-k 20, seed 7").last).to_be_visible()
    send(page, "Which settings do you honour?")
    step_id = new_reply_id(page, None)
    assert watch_reply(page, step_id)[-1]["state"] == "completed"
    note = page.locator(f'#{step_id} [data-testid="metrics-ignored"]')
    expect(note).to_have_count(1)
    expect(note).to_contain_text("top-k is not part of the OpenAI API (kind openai): ignored")
    # The seed is part of the OpenAI API: it was sent, top-k was not.
    assert paced_server.requests()[-1]["sampling"]["seed"] == 7
    assert "top_k" not in paced_server.requests()[-1]["sampling"]


def test_out_of_range_settings_are_refused_with_a_clear_message(page: Page, lab_app: AppServer):
    open_chat(page, lab_app)
    page.locator("#chat-settings-open-modal").click()
    page.locator("#top_k").fill("zero")
    page.locator("#confirm").click()
    refusal = page.locator(".step", has_text="These settings were not applied")
    expect(refusal).to_be_visible()
    expect(refusal).to_contain_text("top-k 'zero' must be a whole number in 1..1000, or empty")
