"""Compare and blind rounds in a real browser, against real backends.

Three real backends stream into three columns: the embedded llama.cpp model,
the real vLLM server and the TGI-protocol test server (both serve the same
bundled SmolLM2). Replies are kept short; waits are generous (2 shared cores).
Storage is a real database: a SQLite file here, and PostgreSQL (a throwaway
cluster) in the restart test.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest
from playwright.sync_api import Page, expect

from backends.base import ChatMessage, GenerationParams
from core.load.prompt_sets import load_prompt_set, prompt_text
from backends.llamacpp import LlamaCppBackend
from backends.openai_compat import OpenAICompatBackend
from config import BackendConfig
from servers.app import AppServer, backend_env, run_coroutine as run, stored
from servers.paced_openai import PacedServer, paced_pair as paced_pairs
from tests.browser_frames import collect_frames, drain_frames, session_id
from tests.controls import config_reaches_the_cap
from tests.fixtures_app import closed_loopback_url, stored_when

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.vllm]

READY_TIMEOUT_MS = 180_000
ROUND_TIMEOUT_S = 240.0
LABELS = {"llama_cpp": "llama.cpp (embedded)", "vllm": "vLLM", "tgi": "TGI (stand-in)"}  # the TGI-protocol test server says so

SNAPSHOT_JS = """
(withHtml) => {
  const grids = [...document.querySelectorAll('[data-testid="compare"]')];
  const grid = grids[grids.length - 1];
  if (!grid) return null;
  const columns = [...grid.querySelectorAll('[data-testid^="column-"][data-state]')].map((c) => {
    const pick = (id) => { const e = c.querySelector(`[data-testid="${id}"]`); return e ? e.innerText.trim() : null; };
    const cell = (id) => { const e = c.querySelector(`[data-testid="${id}"] .font-mono`); return e ? e.innerText.trim() : null; };
    return {label: pick("column-label"), state: c.dataset.state, text: pick("column-text") || "",
            backend: pick("column-backend"), model: pick("column-model"), error: pick("column-error"),
            tokens: cell("metrics-tokens"), ttft: cell("metrics-ttft")};
  });
  return {count: grids.length, final: grid.dataset.final === "true", blind: grid.dataset.blind === "true",
          revealed: grid.dataset.revealed === "true", html: withHtml ? grid.innerHTML : null, columns};
}
"""

# Every text each column of each round showed, recorded by the page itself on every DOM change (a
# poll from the test can miss renders when the machine is busy): window.__columnTexts[round][column].
RECORD_RENDERS_JS = """
() => {
  if (window.__columnTexts) return;
  window.__columnTexts = {};
  const read = () => {
    const grids = document.querySelectorAll('[data-testid="compare"]');
    const grid = grids[grids.length - 1];
    if (!grid) return;
    const round = (window.__columnTexts[grids.length] ||= []);
    grid.querySelectorAll('[data-testid^="column-"][data-state]').forEach((column, index) => {
      const element = column.querySelector('[data-testid="column-text"]');
      const text = element ? element.innerText.trim() : "";
      const texts = (round[index] ||= []);
      if (texts[texts.length - 1] !== text) texts.push(text);
    });
  };
  new MutationObserver(read).observe(document.body, {subtree: true, childList: true, characterData: true});
}
"""


def database_url(tmp_path_factory, name: str) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp(name) / 'lab.db'}"


def three_backends_env(vllm_base_url: str, tgi_server, **more: str) -> dict[str, str]:
    return {
        "BACKENDS": "llama_cpp,vllm,tgi,down",
        "VLLM_BASE_URL": vllm_base_url,
        "TGI_BASE_URL": tgi_server.url,
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down server", connect_timeout_s="2"),
        "DEFAULT_TEMPERATURE": "0",
        "DEFAULT_SYSTEM_PROMPT": "none",
        "DEFAULT_MAX_NEW_TOKENS": "64",
        **more,
    }


def open_chat(page: Page, app: AppServer, model_hint: str) -> None:
    page.goto(app.url)
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text=model_hint).first).to_be_visible(
        timeout=READY_TIMEOUT_MS)


def send(page: Page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()


def watch_round(page: Page, previous_count: int, timeout_s: float = ROUND_TIMEOUT_S) -> list[dict]:
    """Snapshots of the newest round (after `previous_count` rounds) every 40 ms until it is final."""
    snapshots = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = page.evaluate(SNAPSHOT_JS, False)
        if snapshot and snapshot["count"] > previous_count:
            snapshots.append(snapshot)
            if snapshot["final"]:
                return snapshots
        time.sleep(0.02)
    raise AssertionError(f"the round did not finish; last seen: {snapshots[-1:] and snapshots[-1]['columns']}")


def rounds_on_page(page: Page) -> int:
    snapshot = page.evaluate(SNAPSHOT_JS, False)
    return snapshot["count"] if snapshot else 0


def change_settings(page: Page, **selects: str) -> None:
    """Pick an option (by its visible name) in each Select widget of the settings panel, then confirm."""
    page.locator("#chat-settings-open-modal").click()
    for widget, option in selects.items():
        page.locator(f"#{widget}").click()
        page.get_by_role("option", name=option).click()
    page.locator("#confirm").click()
    expect(page.locator(".step", has_text="from your next message").last).to_be_visible()


def latest_round(url: str):
    rounds = run(stored(url, "rounds", 1))
    assert rounds, "no round stored"
    return rounds[0]


def round_replies(url: str, round_id: str) -> dict[str, object]:
    """backend name -> stored reply of that round."""
    replies = run(stored(url, "replies", 100))
    return {reply.backend: reply for reply in replies if reply.round_id == round_id}


def finished_round_replies(url: str, round_id: str, columns: int) -> dict[str, object]:
    """round_replies once every one of `columns` columns has its row (they are written after the
    page shows the round final)."""
    stored_when(url, "replies", 100, until=lambda rs: sum(r.round_id == round_id for r in rs) >= columns)
    return round_replies(url, round_id)


async def expected_prompt_tokens(kind: str, base_url: str, messages: list[ChatMessage]) -> int:
    if kind == "vllm":
        backend = OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=base_url))
    else:
        backend = LlamaCppBackend(BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp"))
    try:
        return await backend.count_prompt_tokens(messages)
    finally:
        await backend.aclose()


# ---------------------------------------------------------------- compare


@pytest.fixture(scope="module")
def compare_db(tmp_path_factory) -> str:
    return database_url(tmp_path_factory, "compare")


@pytest.fixture(scope="module")
def compare_app(app_factory, vllm_base_url, tgi_server, compare_db) -> AppServer:
    env = three_backends_env(vllm_base_url, tgi_server, DEFAULT_MODE="compare",
                             DEFAULT_COMPARE_BACKENDS="llama_cpp,vllm,tgi", DATABASE_URL=compare_db)
    return app_factory(env, name="chainlit-compare")


def test_compare_streams_three_real_backends_live_with_each_its_own_thread(
        page: Page, compare_app: AppServer, compare_db: str, vllm_server, tgi_server):
    open_chat(page, compare_app, tgi_server.model_id)
    page.evaluate(RECORD_RENDERS_JS)
    first_question, second_question = "Name three colours.", "And two more?"
    received: dict[str, dict[str, list[dict]]] = {}  # run order -> server -> chat requests it received
    for question, run_order in ((first_question, "sequential"), (second_question, "concurrent")):
        if run_order == "concurrent":
            change_settings(page, run_order="Concurrent (all at once)")
        run(tgi_server.clear_requests())
        vllm_seen = len(vllm_server.chat_requests())
        before = rounds_on_page(page)
        send(page, question)
        snapshots = watch_round(page, before)
        final = snapshots[-1]
        assert [c["label"] for c in final["columns"]] == ["A", "B", "C"]
        assert [c["backend"] for c in final["columns"]] == [LABELS["llama_cpp"], LABELS["vllm"], LABELS["tgi"]]
        assert all(c["state"] == "completed" and c["text"].strip() for c in final["columns"]), final["columns"]
        assert all(c["tokens"] and c["ttft"] for c in final["columns"]), "every column shows its own figures"
        # Each column updated live: the page drew several distinct partial texts before its final one.
        rendered = page.evaluate("(round) => window.__columnTexts[round] || []", final["count"])
        for index in range(3):
            whole = final["columns"][index]["text"]
            partial = {text for text in rendered[index] if text and text != whole}
            assert len(partial) >= 2, f"column {index} did not stream live: {rendered[index]}"
        stored_round = latest_round(compare_db)
        assert stored_round.run_order == run_order and stored_round.mode == "compare"
        received[run_order] = {
            "tgi": [r["body"] for r in run(tgi_server.requests()) if r["path"] == "/v1/chat/completions"],
            "vllm": vllm_server.chat_requests()[vllm_seen:],
        }

    # In both orders every backend received the same new prompt after its own thread, with the same settings.
    first_round, second_round = run(stored(compare_db, "rounds", 2))[::-1]
    first, second = (finished_round_replies(compare_db, round_.id, len(round_.columns))
                     for round_ in (first_round, second_round))
    threads = {
        "sequential": (first, lambda name: [ChatMessage("user", first_question)]),
        "concurrent": (second, lambda name: [ChatMessage("user", first_question),
                                             ChatMessage("assistant", first[name].reply_text),
                                             ChatMessage("user", second_question)]),
    }
    for run_order, (replies, thread_of) in threads.items():
        assert {reply.prompt for reply in replies.values()} == {thread_of("tgi")[-1].content}, run_order
        assert len({json.dumps(reply.settings_sent["chosen"], sort_keys=True) for reply in replies.values()}) == 1
        # What the servers received, message for message (TGI's test server and vLLM's own request log).
        for server in ("tgi", "vllm"):
            bodies = received[run_order][server]
            assert len(bodies) == 1, f"{server} received {len(bodies)} chat requests in the {run_order} round"
            assert bodies[0]["messages"] == [message.as_dict() for message in thread_of(server)], (run_order, server)
        # The embedded model keeps no request log: the prompt it counted has the thread's token count
        # (and vLLM's own count agrees with the messages it logged).
        for kind in ("llama_cpp", "vllm"):
            counted = replies[kind].record["server"]["input_tokens"]
            assert counted == run(expected_prompt_tokens(kind, vllm_server.base_url, thread_of(kind))), (run_order, kind)


@pytest.fixture(scope="module")
def compare_with_a_down_backend(app_factory, vllm_base_url, tgi_server, tmp_path_factory) -> AppServer:
    env = three_backends_env(vllm_base_url, tgi_server, DEFAULT_MODE="compare", DEFAULT_RUN_ORDER="concurrent",
                             DEFAULT_COMPARE_BACKENDS="tgi,down,llama_cpp",
                             DATABASE_URL=database_url(tmp_path_factory, "down"))
    return app_factory(env, name="chainlit-compare-down")


def test_one_backend_down_leaves_the_other_columns_working(
        page: Page, compare_with_a_down_backend: AppServer, tgi_server):
    open_chat(page, compare_with_a_down_backend, tgi_server.model_id)
    send(page, "Name a fruit.")
    final = watch_round(page, 0)[-1]
    states = {c["backend"]: c for c in final["columns"]}
    assert states["Down server"]["state"] == "error"
    assert "not reachable" in states["Down server"]["error"]
    assert states[LABELS["tgi"]]["state"] == "completed" and states[LABELS["tgi"]]["text"].strip()
    assert states[LABELS["llama_cpp"]]["state"] == "completed" and states[LABELS["llama_cpp"]]["text"].strip()


STOP_CAP = 512
STORY = "Write a very long story about a dragon and a knight."
HOLD_AFTER_TOKENS = 6  # the embedded model and the TGI server hold each reply after this many tokens


@pytest.fixture(scope="module")
def embedded_hold(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def long_compare_app(app_factory, vllm_base_url, tgi_server, tmp_path_factory, embedded_hold) -> AppServer:
    env = three_backends_env(vllm_base_url, tgi_server, DEFAULT_MODE="compare", DEFAULT_RUN_ORDER="concurrent",
                             DEFAULT_COMPARE_BACKENDS="llama_cpp,vllm,tgi",
                             DEFAULT_MAX_NEW_TOKENS=str(STOP_CAP),
                             LAB_TEST_EMBEDDED_HOLD_FILE=str(embedded_hold),
                             LAB_TEST_EMBEDDED_HOLD_AFTER_TOKENS=str(HOLD_AFTER_TOKENS),
                             DATABASE_URL=database_url(tmp_path_factory, "stop"))
    return app_factory(env, name="chainlit-compare-stop")


def test_stop_ends_every_columns_request_and_keeps_the_partial_texts(
        page: Page, long_compare_app: AppServer, tgi_server, vllm_base_url, embedded_hold):
    from tests.fixtures_vllm import held_vllm
    from tests.test_vllm_backend import metric_value

    root = vllm_base_url.removesuffix("/v1")
    # Control runs: each engine, left alone, writes this story to the cap (so "below the cap" means Stop).
    params = GenerationParams(temperature=0.0, top_p=0.95, max_new_tokens=STOP_CAP)
    for config in (BackendConfig(name="llama_cpp", kind="llamacpp", label="llama.cpp"),
                   BackendConfig(name="vllm", kind="vllm", label="vLLM", base_url=vllm_base_url),
                   BackendConfig(name="tgi", kind="tgi", label="TGI", base_url=tgi_server.url)):
        run(config_reaches_the_cap(config, [ChatMessage("user", STORY)], params))
    open_chat(page, long_compare_app, tgi_server.model_id)
    # Every engine is held mid-reply, so all three are still generating when Stop is pressed, on any
    # machine: the embedded model (the test-only hold file) and the TGI server after a few tokens
    # each, vLLM by its own pause, let on a step at a time until its column shows words.
    embedded_hold.touch()
    run(tgi_server.set_faults(hold_after_tokens=HOLD_AFTER_TOKENS))

    def all_streaming() -> bool:
        snapshot = page.evaluate(SNAPSHOT_JS, False)
        return bool(snapshot) and all(c["state"] == "streaming" and len(c["text"].split()) >= 3
                                      for c in snapshot["columns"])

    try:
        with held_vllm(root) as step_until:
            send(page, STORY)
            step_until(all_streaming, timeout_s=ROUND_TIMEOUT_S)
            page.locator("#stop-button").click()
            final = watch_round(page, 0, timeout_s=60)[-1]
    finally:
        embedded_hold.unlink(missing_ok=True)
        run(tgi_server.release_holds())
    assert [c["state"] for c in final["columns"]] == ["stopped"] * 3, final["columns"]
    assert all(c["text"].strip() for c in final["columns"]), "each column keeps its partial text"
    # The requests ended on the servers, before their cap.
    deadline = time.monotonic() + 15
    while metric_value(root, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "vLLM kept generating after Stop"
        time.sleep(0.2)
    async def tgi_ended():
        # The server sees the closed connection when it next tries to send: poll, do not race it.
        latest = (await tgi_server.generations())[-1]
        return latest if latest["status"] != "running" else None

    generation = run(tgi_server.wait_until(tgi_ended, timeout_s=15, what="TGI to end the generation after Stop"))
    assert generation["status"] == "cancelled" and generation["generated_tokens"] < STOP_CAP
    assert all(int(c["tokens"].rstrip(" ≈")) < STOP_CAP for c in final["columns"])


# ---------------------------------------------------------------- blind


@pytest.fixture(scope="module")
def blind_db(tmp_path_factory) -> str:
    return database_url(tmp_path_factory, "blind")


@pytest.fixture(scope="module")
def blind_app(app_factory, vllm_base_url, tgi_server, blind_db) -> AppServer:
    env = three_backends_env(vllm_base_url, tgi_server, DEFAULT_MODE="blind",
                             DEFAULT_COMPARE_BACKENDS="llama_cpp,vllm,tgi", DATABASE_URL=blind_db)
    return app_factory(env, name="chainlit-blind")


def post_action(page: Page, app: AppServer, frames, payload: dict) -> dict:
    response = page.request.post(f"{app.url}/project/action",
                                 data={"sessionId": session_id(frames), "action": {"name": "vote", "payload": payload}})
    assert response.ok, response.text()
    return response.json()["response"]


def identifying_words(vllm_base_url: str, tgi_server) -> list[str]:
    return [*LABELS.values(), "llama_cpp", "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1",
            urlparse(vllm_base_url).netloc, urlparse(tgi_server.url).netloc, "in-process"]


def test_blind_round_sends_no_names_until_the_vote_then_reveals_and_counts_it(
        page: Page, blind_app: AppServer, blind_db: str, vllm_base_url: str, tgi_server):
    frames = collect_frames(page)
    open_chat(page, blind_app, tgi_server.model_id)
    received_before = len(drain_frames(page, frames))  # the chat start's frames are all in
    send(page, "List three fruits.")
    watch_round(page, 0)
    # Every frame of the round's task, late ones included (its last element update, task_end).
    drain_frames(page, frames, since=received_before, until_task_end=True)
    final = page.evaluate(SNAPSHOT_JS, True)
    assert final["blind"] and not final["revealed"]
    secrets = identifying_words(vllm_base_url, tgi_server)
    for word in secrets:
        assert word not in final["html"], f"{word!r} is in the blind round's element"
        offenders = [frame[:60] for frame in frames["received"][received_before:] if word in frame]
        assert not offenders, f"{word!r} was sent to the browser before the vote, in {offenders}"
    assert len(final["columns"]) == 3, final["columns"]
    assert all(c["backend"] is None and c["tokens"] is None for c in final["columns"])
    assert all(c["state"] == "completed" and c["text"].strip() for c in final["columns"])

    page.locator('[data-testid="vote-B"]').click()
    expect(page.locator('[data-testid="vote-summary"]')).to_contain_text("B better")
    revealed = page.evaluate(SNAPSHOT_JS, False)
    assert revealed["revealed"]
    stored_round = latest_round(blind_db)
    backend_of = {column.label: column.backend for column in stored_round.columns}
    assert sorted(backend_of.values()) == ["llama_cpp", "tgi", "vllm"]
    assert {c["label"]: c["backend"] for c in revealed["columns"]} == {
        label: LABELS[name] for label, name in backend_of.items()}
    votes = run(stored(blind_db, "votes"))
    assert len(votes) == 1 and votes[0].vote.outcome == "win" and votes[0].winner_backend == backend_of["B"]

    # A repeated vote, and one for a round that does not exist, are refused with a clear message.
    again = post_action(page, blind_app, frames, {"round_id": stored_round.id, "outcome": "win", "winner": "A"})
    assert again["ok"] is False and "already" in again["message"]
    forged = post_action(page, blind_app, frames, {"round_id": "no-such-round", "outcome": "tie"})
    assert forged["ok"] is False and "no such round" in forged["message"]
    odd = post_action(page, blind_app, frames, {"round_id": stored_round.id, "outcome": "landslide"})
    assert odd["ok"] is False and "outcome" in odd["message"]
    assert len(run(stored(blind_db, "votes"))) == 1

    send(page, "/leaderboard")
    board = page.locator(".step", has_text="Leaderboard").last
    expect(board).to_contain_text("ratings from 1 blind vote")
    winner = backend_of["B"]
    expect(board.locator("tr", has_text=winner).first).to_be_visible()
    expect(board).to_contain_text("Only 1 vote")


def compare_updates(frames: list[str], round_id: str) -> list[dict]:
    """The compare grid's props in every update among `frames` for one round, in order: Chainlit's element
    events and the live refreshes a tapped page gets past them (`lab_live`, ui/live_tap.py)."""
    updates = []
    for frame in frames:
        for packet in frame.split("\x1e"):  # socket.io packets: '42["element", {...}]'
            start = packet.find("[")
            if start <= 0 or not packet[:start].isdigit():
                continue
            try:
                event = json.loads(packet[start:])
            except ValueError:
                continue
            if isinstance(event, list) and len(event) == 2 and event[0] in ("element", "lab_live") \
                    and isinstance(event[1], dict):
                props = event[1].get("props") or {}
                if props.get("kind") == "compare" and props.get("roundId") == round_id:
                    updates.append(props)
    return updates


@pytest.fixture(scope="module")
def count_tokens():
    """The bundled model's tokenizer (all three backends serve that model): text -> token count."""
    from llama_cpp import Llama

    from backends.llamacpp import bundled_model_path

    vocab = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    return lambda text: len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))


@pytest.fixture(scope="module")
def blind_pace_db(tmp_path_factory) -> str:
    return database_url(tmp_path_factory, "blind-pace")


@pytest.fixture(scope="module")
def blind_pace_app(app_factory, vllm_base_url, tgi_server, blind_pace_db) -> AppServer:
    env = three_backends_env(vllm_base_url, tgi_server, DEFAULT_MODE="blind", DEFAULT_REVEAL="pace",
                             DEFAULT_COMPARE_BACKENDS="llama_cpp,vllm,tgi", DATABASE_URL=blind_pace_db)
    return app_factory(env, name="chainlit-blind-pace")


# Re-tokenizing a shown prefix can differ from the tokens generated by a token or two.
RETOKENIZE_SLACK = 3


def test_blind_pace_shows_every_column_at_one_pace_in_tokens_and_no_names(
        page: Page, blind_pace_app: AppServer, blind_pace_db: str, vllm_base_url: str, tgi_server, count_tokens):
    frames = collect_frames(page)
    open_chat(page, blind_pace_app, tgi_server.model_id)
    secrets = identifying_words(vllm_base_url, tgi_server)
    prompts = (("Describe a cat in three sentences.", "sequential"), ("Describe a dog in three sentences.", "concurrent"))
    for prompt, run_order in prompts:
        if run_order == "concurrent":
            # A round on the same backends waits for the last one's vote (core.disclosure).
            page.locator('[data-testid="vote-tie"]').last.click()
            expect(page.locator('[data-testid="vote-summary"]').last).to_contain_text("Tie")
            change_settings(page, run_order="Concurrent (all at once)")
        received_before = len(drain_frames(page, frames))
        before = rounds_on_page(page)
        send(page, prompt)
        watch_round(page, before)
        received = drain_frames(page, frames, since=received_before, until_task_end=True)
        for word in secrets:
            offenders = [frame[:60] for frame in received if word in frame]
            assert not offenders, f"{word!r} was sent to the browser before the vote, in {offenders}"
        stored_round = latest_round(blind_pace_db)
        assert stored_round.run_order == run_order
        replies = finished_round_replies(blind_pace_db, stored_round.id, len(stored_round.columns))
        whole = {column.label: replies[column.backend].reply_text for column in stored_round.columns}
        updates = compare_updates(received, stored_round.id)
        streaming = [{c["label"]: c["text"] for c in props["columns"]} for props in updates
                     if any(c["state"] == "generating" for c in props["columns"])]
        assert len(streaming) >= 5, f"only {len(streaming)} updates while the {run_order} round streamed"
        assert any(any(shown.values()) for shown in streaming), f"no text moved before the {run_order} round ended"
        for shown in streaming:
            assert all(whole[label].startswith(text) for label, text in shown.items()), shown
            partial = {label: count_tokens(text) for label, text in shown.items() if text and text != whole[label]}
            complete = {label: count_tokens(text) for label, text in shown.items() if text and text == whole[label]}
            if partial:
                # Every column still being revealed shows the same number of tokens; a finished shorter one, all.
                assert max(partial.values()) - min(partial.values()) <= RETOKENIZE_SLACK, (run_order, partial, shown)
                assert all(count <= max(partial.values()) + RETOKENIZE_SLACK for count in complete.values())
        if run_order == "sequential":
            # The text moves before the last column runs (the columns run in a random order, not A-B-C):
            # two columns at the pace of the second while the third waits.
            assert any(sum(bool(text) for text in shown.values()) == 2 for shown in streaming), streaming[-3:]
        final = updates[-1]
        assert {c["label"]: c["text"] for c in final["columns"]} == whole


# ---------------------------------------------------------------- storage across a restart


@pytest.fixture(scope="module")
def paced_pair() -> Iterator[tuple[PacedServer, PacedServer]]:
    with paced_pairs("restart", tokens=(12, 10)) as servers:
        yield servers


@pytest.fixture(params=["sqlite", "postgresql"])
def restart_database(request, tmp_path_factory) -> str:
    """A fresh database: a SQLite file, or a new database on the throwaway PostgreSQL cluster."""
    if request.param == "sqlite":
        return database_url(tmp_path_factory, "restart")
    from tests.fixtures_postgres import new_postgres_database

    return run(new_postgres_database(request.getfixturevalue("postgres_url")))


def blind_pair_env(paced_pair: tuple[PacedServer, PacedServer], database: str, **more: str) -> dict[str, str]:
    """Blind rounds between the paced pair, as backends "left" and "right", stored in `database`."""
    first, second = paced_pair
    return {
        "BACKENDS": "left,right",
        **backend_env("left", kind="openai", base_url=first.base_url, label="Left engine"),
        **backend_env("right", kind="openai", base_url=second.base_url, label="Right engine"),
        "DEFAULT_MODE": "blind", "DEFAULT_COMPARE_BACKENDS": "left,right", "DEFAULT_SYSTEM_PROMPT": "none",
        "DATABASE_URL": database, **more,
    }


def first_round_voted_tie(page: Page, message: str, database: str):
    """Send the chat's first message, wait for its round, vote tie; the stored round."""
    send(page, message)
    watch_round(page, 0)
    page.locator('[data-testid="vote-tie"]').click()
    expect(page.locator('[data-testid="vote-summary"]')).to_contain_text("Tie")
    return latest_round(database)


def test_a_round_and_its_vote_survive_an_app_restart(page: Page, app_factory, paced_pair, restart_database):
    env = blind_pair_env(paced_pair, restart_database)
    app = app_factory(env, name="chainlit-restart-before")
    open_chat(page, app, "paced-test-model")
    stored_round = first_round_voted_tie(page, "Hello, both of you.", restart_database)
    app.stop()

    restarted = app_factory(env, name="chainlit-restart-after")
    assert run(stored(restarted.env["DATABASE_URL"], "get_round", stored_round.id)) == stored_round
    votes = [v for v in run(stored(restart_database, "votes")) if v.vote.round_id == stored_round.id]
    assert len(votes) == 1 and votes[0].vote.outcome == "tie"
    assert len(round_replies(restart_database, stored_round.id)) == 2
    open_chat(page, restarted, "paced-test-model")
    send(page, "/leaderboard")
    board = page.locator(".step", has_text="Leaderboard").last
    expect(board).to_contain_text("blind vote")
    expect(board.locator("tr", has_text="left").first).to_be_visible()


def test_the_leaderboard_holds_apart_speed_length_and_style_filters_views_and_exports(
        page: Page, app_factory, paced_pair, tmp_path_factory):
    """A round on a prompt from the set and one on a typed prompt whose vote comment names a
    backend: one vote rated (with its category), one kept but not rated; the leaderboard shows
    the controlled ratings, filters by typed words and by button, and exports the votes."""
    db = database_url(tmp_path_factory, "leaderboard-views")
    app = app_factory(blind_pair_env(paced_pair, db, DEFAULT_REVEAL="pace"), name="chainlit-leaderboard-views")
    frames = collect_frames(page)
    open_chat(page, app, "paced-test-model")
    set_round = first_round_voted_tie(page, "/prompt", db)
    category = next(p.category for p in load_prompt_set("en") if prompt_text(p) == set_round.prompt)
    assert set_round.reveal == "pace"

    send(page, "Which engine is this?")
    watch_round(page, 1)
    typed_round = latest_round(db)
    named = post_action(page, app, frames, {"round_id": typed_round.id, "outcome": "win", "winner": "A",
                                            "comment": "A must be the Left engine"})
    assert named["ok"] and "kept but not rated" in named["message"]
    assert [record.vote.unrated_reason for record in run(stored(db, "votes"))] == [None, "comment_names_backend"]

    send(page, "/leaderboard")
    board = page.locator(".step", has_text="Leaderboard").last
    expect(board).to_contain_text("ratings from 1 blind vote")
    expect(board).to_contain_text("1 blind vote(s) are kept but not rated")
    expect(board).to_contain_text("Ratings at equal speed, length and markdown style")
    expect(board).to_contain_text(f"Votes by category: {category} (1)")
    page.get_by_role("button", name="en (1)").click()
    expect(page.locator(".step", has_text="This view: language en, 1 of 1 rated vote(s).").last).to_be_visible()
    send(page, "/leaderboard category=nope")
    expect(page.locator(".step", has_text="There is no category “nope”").last).to_be_visible()
    page.get_by_role("button", name="Export votes (JSONL)").last.click()
    exported = page.locator(".step", has_text="2 vote(s) as 2 pairwise battle(s)").last
    expect(exported).to_be_visible()
    # The exported file itself, downloaded as a person would: one battle per vote, as voted.
    link = exported.get_by_role("link", name=re.compile(r"votes-\d{4}-\d\d-\d\d\.jsonl"))
    expect(link).to_be_visible()
    lines = [json.loads(line) for line in page.request.get(link.get_attribute("href")).text().splitlines()]
    by_round = {line["round_id"]: line for line in lines}
    assert len(lines) == 2 and set(by_round) == {set_round.id, typed_round.id}, lines
    tied, named_line = by_round[set_round.id], by_round[typed_round.id]
    assert tied["winner"] == "tie" and tied["rated"] and tied["category"] == category and tied["reveal"] == "pace"
    assert tied["conversation_a"][0] == {"role": "user", "content": set_round.prompt}
    assert named_line["winner"] == "model_a" and not named_line["rated"]
    assert named_line["unrated_reason"] == "comment_names_backend"
    assert named_line["comment"] == "A must be the Left engine" and named_line["category"] == "free"
    assert named_line["conversation_a"][0] == {"role": "user", "content": "Which engine is this?"}
    assert all(line["anony"] for line in lines)
