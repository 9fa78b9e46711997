"""The 45-minute lesson (docs/teachers/lesson-plan.md) in class mode, in real browser tabs: the
lab made by `bash scripts/lab.sh --class 3`, a teacher's tab and three students' tabs, each signed
in with the keyboard alone from the class sheet, then the five demos as the plan says to click
them. The engines are the embedded model, `llama-server` and the TGI-protocol stand-in (vLLM's
CPU build is left out to keep the suite's time; tests/test_lab.py runs a round on it)."""

from __future__ import annotations

import re

import pytest
import requests
from playwright.sync_api import Page, expect

from tests.test_compare_browser import SNAPSHOT_JS, change_settings, watch_round
from tests.test_engines_browser import command, engine_value
from tests.test_lab import ctrl_c, processes_started_by, still_alive
from tests.test_lab_class import REACHED_AT, sheet, start_class_lab
from servers.process import free_port

pytestmark = pytest.mark.slow
READY_TIMEOUT_MS = 180_000
ENGINES = ("llama_cpp", "llama_server", "tgi")


def sign_in_by_keyboard(page: Page, url: str, user: str, password: str) -> None:
    """The login page with the keyboard alone: the user name field has the focus, Tab, Enter."""
    page.goto(url)
    expect(page.locator("#email")).to_be_focused(timeout=60_000)
    page.keyboard.type(user)
    page.keyboard.press("Tab")
    expect(page.locator("#password")).to_be_focused()
    page.keyboard.type(password)
    page.keyboard.press("Enter")


def ready(page: Page) -> None:
    expect(page.locator(".step", has_text="Backends").first).to_be_visible(timeout=READY_TIMEOUT_MS)


def completed_replies(page: Page) -> int:
    return page.locator('[data-testid="metrics"][data-state="completed"]').count()


@pytest.mark.timeout(1800)
def test_the_lessons_five_demos_run_in_class_mode_with_a_teacher_and_three_students(
        chromium, tmp_path, tgi_server, llama_server_installed):
    port = free_port()
    url = f"http://{REACHED_AT}:{port}"
    process, lines, _ = start_class_lab(tmp_path / "logs", tmp_path / "class", port, without="vllm",
                                        TGI_BASE_URL=tgi_server.url, DEFAULT_MAX_NEW_TOKENS="24")
    tabs: dict[str, Page] = {}
    try:
        assert lines["LAB_BACKENDS"].split(",") == list(ENGINES)
        logins = sheet(lines["LAB_CLASS_SHEET"])
        assert "Serving Lab" in requests.get(url + "/logo?theme=dark", timeout=30).text

        # Students join: the login page is the product's, asks for a user name, and says plainly
        # when the password is wrong.
        for user in ("teacher", "student01", "student02", "student03"):
            tabs[user] = chromium.new_context(locale="en-US", viewport={"width": 1400, "height": 1000}).new_page()
        first = tabs["student01"]
        sign_in_by_keyboard(first, url, "student01", logins["student02"])
        expect(first.get_by_role("alert")).to_contain_text("Wrong user name or password", timeout=30_000)
        expect(first.get_by_role("heading", name="Sign in to Serving Lab")).to_be_visible()
        expect(first.get_by_text("User name", exact=True)).to_be_visible()
        expect(first.locator("#email")).to_have_attribute("placeholder", "student01")
        assert not first.get_by_text("Email address").count()
        for user, page in tabs.items():
            sign_in_by_keyboard(page, url, user, logins[user])
        for page in tabs.values():
            ready(page)
        teacher = tabs["teacher"]
        students = [tabs[f"student0{n}"] for n in (1, 2, 3)]

        # Demo 1: one reply's figures, for the teacher and, at once, for every student.
        for page in (teacher, *students):
            command(page, "Explain what a GPU does, in one sentence.")
        for page in (teacher, *students):
            expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=240_000)
        figures = teacher.locator('[data-testid="metrics"]').last
        expect(figures).to_contain_text("TTFT")
        expect(figures).to_contain_text("tokens/s")
        teacher.locator('[data-testid="metrics-timeline-toggle"]').last.click()
        expect(teacher.locator('[data-testid="metrics-timeline"]').last).to_be_visible()

        # Demo 2: the same prompt on three engines, side by side.
        change_settings(teacher, mode="Compare side by side")
        command(teacher, "Name one colour.")
        final = watch_round(teacher, 0, timeout_s=300)[-1]
        assert len(final["columns"]) == 3 and all(c["state"] == "completed" for c in final["columns"]), final

        # Demo 3: simulated students on each chosen engine; the panel shows them at work.
        command(teacher, "/engines")
        expect(teacher.locator('[data-testid="engine-llama_cpp"]')).to_be_visible(timeout=60_000)
        teacher.locator('[data-testid="simulate-8"]').last.click()
        expect(teacher.locator('[data-testid="simulation"]').last).to_be_visible(timeout=60_000)
        expect(teacher.locator(".step", has_text="Simulation of 8 user(s) done").last).to_be_visible(timeout=900_000)
        assert engine_value(teacher, "llama_cpp", "queue") is not None

        # Demo 4: how many students fit, on the embedded model, against this machine's objective.
        change_settings(teacher, mode="Chat with one backend")
        command(teacher, "/engines")
        teacher.locator('[data-testid="capacity-sweep"]').last.click()
        sweep = teacher.locator('[data-testid="sweep"]').last
        expect(sweep).to_have_attribute("data-done", "true", timeout=600_000)
        answer = sweep.locator('[data-testid="sweep-answer"]').inner_text()
        assert re.search(r"(up to \d+ people|only 1 person) at", answer) and "TTFT under 3 s" in answer, answer

        # Demo 5: every student votes blind on a prompt of the set; the teacher may still watch the
        # engines meanwhile, a student waits for their vote; then the leaderboard.
        for page in students:
            change_settings(page, mode="Blind comparison (vote first)")
            command(page, "/prompt")
        for page in students:
            watch_round(page, 0, timeout_s=600)
            snapshot = page.evaluate(SNAPSHOT_JS, False)
            assert snapshot["blind"] and not snapshot["revealed"], snapshot
        command(students[0], "/engines")
        expect(students[0].locator(".step", has_text="/engines waits until you have voted").last).to_be_visible(
            timeout=30_000)
        expect(students[0].locator('[data-testid="engines"]')).to_have_count(0)
        command(teacher, "/engines")
        expect(teacher.locator('[data-testid="engines"]').last).to_be_visible(timeout=30_000)
        for page, choice in zip(students, ("vote-A", "vote-B", "vote-tie")):
            page.locator(f'[data-testid="{choice}"]').last.click()
            expect(page.locator('[data-testid="vote-summary"]').last).to_be_visible(timeout=30_000)
            assert page.evaluate(SNAPSHOT_JS, False)["revealed"]
        command(teacher, "/leaderboard")
        board = teacher.locator(".step", has_text="Leaderboard").last
        expect(board).to_contain_text("ratings from 3 blind vote(s)", timeout=60_000)
        started = processes_started_by(tmp_path / "logs", process.pid)
    finally:
        for page in tabs.values():
            page.context.close()
        ctrl_c(process)
    assert process.returncode == 0
    assert not [pid for pid, ticks in started.items() if still_alive(pid, ticks)]
