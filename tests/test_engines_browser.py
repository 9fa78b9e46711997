"""The engines at work, in a browser: the engine panel, "Simulate N users", /bench, and each
reply's engine state - against the real vLLM server, the embedded model and the TGI stand-in."""

from __future__ import annotations

import secrets
import time

import pytest
from playwright.sync_api import Page, expect

from core.auth import hash_password
from servers.app import AppServer
from tests.fixtures_app import stored_when
from tests.fixtures_vllm import held_vllm
from tests.test_vllm_backend import engine_state

pytestmark = pytest.mark.slow

READY_TIMEOUT_MS = 180_000


def open_chat(page: Page, app: AppServer) -> None:
    page.goto(app.url)
    expect(page.locator(".step", has_text="Backends").first).to_be_visible(timeout=READY_TIMEOUT_MS)


def command(page: Page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.locator("#chat-submit").click()


def engine_value(page: Page, engine: str, row: str) -> str | None:
    cell = page.locator(f'[data-testid="engine-{engine}"] [data-testid="engine-row-{row}"] [data-testid="engine-value"]')
    return cell.last.inner_text() if cell.count() else None


def watch_panel(page: Page, engine: str, row: str, until, timeout_s: float, poll_s: float = 0.2) -> list[str | None]:
    """Readings of one row of the panel until `until(readings)` is true."""
    readings: list[str | None] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readings.append(engine_value(page, engine, row))
        if until(readings):
            return readings
        time.sleep(poll_s)
    raise AssertionError(f"{engine} {row}: {readings[-20:]}")


def as_int(value: str | None) -> int:
    return int(value) if value not in (None, "") else -1


def test_vllm_panel_moves_under_simulated_load_and_back(page: Page, app_factory, vllm_base_url):
    app = app_factory({"BACKENDS": "vllm", "VLLM_BASE_URL": vllm_base_url, "DEFAULT_SYSTEM_PROMPT": "none",
                       "DEFAULT_MAX_NEW_TOKENS": "32"}, name="chainlit-engines-vllm")
    open_chat(page, app)
    command(page, "/engines")
    expect(page.locator('[data-testid="engine-vllm"]')).to_contain_text("vLLM /metrics", timeout=30_000)
    assert as_int(engine_value(page, "vllm", "running")) == 0
    expect(page.locator('[data-testid="engine-row-kv"]')).to_be_visible()
    # Eight users: vLLM batches them - several run at once. vLLM is held (paused with its requests
    # kept) while the panel, refreshed once a second, is read: on a fast machine the whole batch
    # could otherwise finish between two refreshes.
    root = vllm_base_url.removesuffix("/v1")
    with held_vllm(root) as step_until:
        page.locator('[data-testid="simulate-8"]').click()
        step_until(lambda: engine_state(root).running_requests >= 2, timeout_s=120)
        busy = watch_panel(page, "vllm", "running", lambda r: as_int(r[-1]) >= 2, timeout_s=30)
        assert max(as_int(v) for v in busy) >= 2
        expect(page.locator('[data-testid="simulation"]')).to_be_visible()
    rate = watch_panel(page, "vllm", "rate", lambda r: r[-1] not in (None, "0.0"), timeout_s=60)
    assert float(rate[-1]) > 0
    # Done: back to nothing running, and the "as N grows" chart has its point.
    expect(page.locator(".step", has_text="Simulation of 8 user(s) done")).to_be_visible(timeout=300_000)
    watch_panel(page, "vllm", "running", lambda r: as_int(r[-1]) == 0, timeout_s=30)
    expect(page.locator('[data-testid="users-chart-rate"] circle')).to_have_count(1, timeout=10_000)

    # A reply records what the engine was doing just before it was sent.
    command(page, "Say hello.")
    expect(page.locator('[data-testid="metrics"][data-state="completed"]').last).to_be_visible(timeout=120_000)
    (reply,) = [r for r in stored_when(app.env["DATABASE_URL"], "replies", 50,
                                       until=lambda rs: any(r.prompt == "Say hello." for r in rs))
                if r.prompt == "Say hello."]
    engine = reply.record["engine_at_start"]
    assert engine["source"] == "vLLM /metrics" and engine["running_requests"] == 0
    assert engine["kv_cache_usage"] is not None
    page.locator('[data-testid="metrics-timeline-toggle"]').last.click()
    expect(page.locator('[data-testid="engine-at-start"]').last).to_contain_text("0 running")


def test_embedded_queue_shows_in_the_panel_and_my_own_message_still_gets_its_reply(page: Page, app_factory, tmp_path):
    hold = tmp_path / "hold-embedded"
    app = app_factory({"BACKENDS": "llama_cpp", "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_MAX_NEW_TOKENS": "32",
                       "LAB_TEST_EMBEDDED_HOLD_FILE": str(hold)}, name="chainlit-engines-embedded")
    open_chat(page, app)
    command(page, "/engines")
    expect(page.locator('[data-testid="engine-llama_cpp"]')).to_contain_text("llama.cpp (embedded)", timeout=30_000)
    # The first simulated request keeps the model (the test hook) until the file goes, as a long
    # reply would, so the queue behind it is there to see however fast the model is.
    hold.touch()
    try:
        page.locator('[data-testid="simulate-4"]').click()
        # Four users: one has the model, the other three wait their turn.
        queued = watch_panel(page, "llama_cpp", "queue", lambda r: as_int(r[-1]) == 3, timeout_s=60)
        assert as_int(queued[-1]) == 3
        assert engine_value(page, "llama_cpp", "context") is not None
        # The person's own message: queued behind the four simulated users, with its place shown.
        command(page, "Are you still there?")
        reply = page.locator('[data-testid="metrics"]').last
        expect(reply).to_have_attribute("data-state", "queued", timeout=30_000)
        expect(reply.locator('[data-testid="metrics-status"]')).to_contain_text("4 ahead")
    finally:
        hold.unlink(missing_ok=True)
    # Let go: the queue moves, the message is answered and the simulation ends.
    expect(reply).to_have_attribute("data-state", "completed", timeout=300_000)
    expect(page.locator(".step", has_text="Simulation of 4 user(s) done")).to_be_visible(timeout=300_000)
    watch_panel(page, "llama_cpp", "queue", lambda r: as_int(r[-1]) == 0, timeout_s=30)


def test_the_tgi_stand_ins_metrics_reach_the_panel_and_bench_runs_in_the_chat(page: Page, app_factory, tgi_server):
    app = app_factory({"BACKENDS": "tgi", "TGI_BASE_URL": tgi_server.url, "DEFAULT_SYSTEM_PROMPT": "none"},
                      name="chainlit-engines-tgi")
    open_chat(page, app)
    expect(page.locator(".step", has_text="stand-in").first).to_be_visible()
    command(page, "/engines")
    card = page.locator('[data-testid="engine-tgi"]')
    expect(card).to_contain_text("TGI /metrics", timeout=30_000)
    expect(card).to_contain_text("TGI (stand-in)")  # its card says it only stands in for TGI
    expect(card.locator('[data-testid="engine-row-queue"]')).to_be_visible()
    expect(card.locator('[data-testid="engine-row-batch"]')).to_be_visible()
    command(page, "/bench")
    table = page.locator(".step", has_text="Benchmark (").last
    expect(table).to_be_visible(timeout=300_000)
    expect(table).to_contain_text("tokens/s at 4 concurrent")
    expect(table).to_contain_text("TGI †")
    expect(table).to_contain_text("is a stand-in")
    expect(table.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
    # After the benchmark's requests TGI has a mean time per token to show.
    expect(card.locator('[data-testid="engine-row-tpot"]')).to_be_visible(timeout=15_000)


def test_only_teachers_may_load_the_engines_and_one_simulation_runs_at_a_time(chromium, app_factory, tmp_path):
    passwords = {"teacher": secrets.token_hex(6), "student": secrets.token_hex(6)}
    hold = tmp_path / "hold-embedded"
    app = app_factory({
        "BACKENDS": "llama_cpp", "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_MAX_NEW_TOKENS": "64",
        "LAB_TEST_EMBEDDED_HOLD_FILE": str(hold),
        "AUTH_USERS": ",".join(f"{n}:{hash_password(p, iterations=1000)}" for n, p in passwords.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
    }, name="chainlit-engines-teachers")
    pages = {}
    try:
        for name in ("student", "teacher"):
            page = chromium.new_context(locale="en-US", viewport={"width": 1300, "height": 1000}).new_page()
            page.goto(app.url)
            page.locator("#email").fill(name)
            page.locator("#password").fill(passwords[name])
            page.get_by_role("button", name="Sign In").click()
            expect(page.locator(".step", has_text="Backends").first).to_be_visible(timeout=READY_TIMEOUT_MS)
            command(page, "/engines")
            expect(page.locator('[data-testid="engines"]')).to_be_visible(timeout=30_000)
            pages[name] = page
        student, teacher = pages["student"], pages["teacher"]
        expect(student.locator('[data-testid="simulate-1"]')).to_have_count(0)
        expect(student.locator('[data-testid="engines"]')).to_contain_text("Only a teacher")
        command(student, "/bench")
        expect(student.locator(".step", has_text="Only a teacher may start load")).to_be_visible()
        hold.touch()  # the simulation's first request keeps the model: it is still running below
        teacher.locator('[data-testid="simulate-16"]').click()
        expect(teacher.locator('[data-testid="simulation"]')).to_be_visible(timeout=30_000)
        teacher.locator('[data-testid="simulate-2"]').click()
        expect(teacher.locator(".step", has_text="already running").last).to_be_visible(timeout=30_000)
        command(teacher, "/engines")  # re-opening the panel keeps working while the simulation runs
        expect(teacher.locator('[data-testid="engines"]')).to_have_count(2, timeout=30_000)
        teacher.locator('[data-testid="close-panel"]').last.click()
        expect(teacher.locator('[data-testid="panel-message"]').last).to_contain_text("Closed", timeout=30_000)
    finally:
        hold.unlink(missing_ok=True)
        for page in pages.values():
            page.context.close()


def test_blind_mode_keeps_the_panel_closed(page: Page, app_factory):
    app = app_factory({"BACKENDS": "llama_cpp,other", "OTHER_KIND": "openai", "OTHER_BASE_URL": "http://127.0.0.1:9/v1",
                       "DEFAULT_MODE": "blind", "DEFAULT_SYSTEM_PROMPT": "none"}, name="chainlit-engines-blind")
    open_chat(page, app)
    command(page, "/engines")
    expect(page.locator(".step", has_text="off in blind mode")).to_be_visible(timeout=30_000)
    expect(page.locator('[data-testid="engines"]')).to_have_count(0)
