"""The app from the keyboard alone, and the live figures as a screen reader hears them.

No mouse here: focus moves with Tab (and Shift+Tab), buttons are pressed with Enter or Space,
lists are walked with the arrow keys and a dialog is left with Escape. Each test asserts what a
person would notice (a vote stored, a stream stopped, a setting applied to the next message),
each with a control where the effect could be there anyway. Two paced OpenAI-protocol servers
stand in for two engines.

axe-core's checks of every view run in scripts/screenshots.py (tests/test_screenshots_browser.py).
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from servers.app import AppServer, backend_env
from servers.paced_openai import paced_pair
from tests.fixtures_app import stored_when

pytestmark = [pytest.mark.browser, pytest.mark.slow]

READY_TIMEOUT_MS = 120_000
LABELS = {"left": "Left engine", "right": "Right engine"}
MAX_TABS = 80


@pytest.fixture(scope="module")
def pair():
    with paced_pair("keyboard", tokens=(12, 9)) as servers:
        yield servers


def pair_env(pair, tmp_path_factory, name: str, **more: str) -> dict[str, str]:
    left, right = pair
    return {
        "BACKENDS": "left,right",
        **backend_env("left", kind="openai", base_url=left.base_url, label=LABELS["left"]),
        **backend_env("right", kind="openai", base_url=right.base_url, label=LABELS["right"]),
        "DEFAULT_BACKEND": "left", "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_COMPARE_BACKENDS": "left,right",
        "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp(name) / 'lab.db'}",
        **more,
    }


def wait_ready(page: Page) -> None:
    expect(page.locator(".step", has_text="paced-test-model").first).to_be_visible(timeout=READY_TIMEOUT_MS)


def focused_matches(page: Page, selector: str) -> bool:
    return page.evaluate("(s) => !!document.activeElement && document.activeElement.matches(s)", selector)


def tab_to(page: Page, selector: str, *, backwards: bool = False) -> None:
    """Press Tab (Shift+Tab backwards) until the focused element matches `selector`."""
    for _ in range(MAX_TABS):
        if focused_matches(page, selector):
            return
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
    focused = page.evaluate("() => document.activeElement && document.activeElement.outerHTML.slice(0, 200)")
    raise AssertionError(f"{MAX_TABS} Tabs never reached {selector}; focus is on {focused}")


def type_message(page: Page, text: str) -> None:
    """Focus the message box with Tab, type, and send with Enter."""
    tab_to(page, "#chat-input")
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def pick_option(page: Page, widget: str, option: str) -> None:
    """Open the Select `widget` of the settings panel with Space and choose `option` with the
    arrow keys and Enter."""
    tab_to(page, f"#{widget}")
    page.keyboard.press("Space")
    listbox = page.get_by_role("listbox")
    expect(listbox).to_be_visible()
    for _ in range(20):
        focused = page.evaluate("() => document.activeElement.getAttribute('role') === 'option' "
                                "&& document.activeElement.innerText.trim()")
        if focused and focused.startswith(option):  # "Right engine (right)": the label, then the name
            page.keyboard.press("Enter")
            expect(listbox).to_be_hidden()
            return
        page.keyboard.press("ArrowDown")
    options = listbox.locator('[role="option"]').evaluate_all("(os) => os.map((o) => o.outerHTML.slice(0, 300))")
    focused = page.evaluate("() => JSON.stringify(document.activeElement.innerText) + document.activeElement.outerHTML.slice(300, 900)")
    raise AssertionError(f"the arrow keys never reached {option!r} in #{widget}: {options}; focus on {focused}")


@pytest.fixture(scope="module")
def chat_app(app_factory, pair, tmp_path_factory) -> AppServer:
    return app_factory(pair_env(pair, tmp_path_factory, "keyboard-chat"), name="chainlit-keyboard")


def last_request_text(server) -> str:
    requests = server.requests()
    return requests[-1]["last_user_text"] if requests else ""


def wait_for_request(server, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while last_request_text(server) != text:
        assert time.monotonic() < deadline, f"{text!r} never reached the engine (last: {last_request_text(server)!r})"
        time.sleep(0.1)


def test_the_settings_panel_works_from_the_keyboard_and_escape_leaves_it_unchanged(
        page: Page, chat_app: AppServer, pair):
    left, right = pair
    page.goto(chat_app.url)
    wait_ready(page)
    applied = page.locator(".step", has_text="from your next message")

    # Control: the panel changed with the keys but left with Escape applies nothing.
    tab_to(page, "#chat-settings-open-modal")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-settings")).to_be_visible()
    pick_option(page, "backend", LABELS["right"])
    page.keyboard.press("Escape")
    expect(page.locator("#chat-settings")).to_be_hidden()
    type_message(page, "still on the left?")
    wait_for_request(left, "still on the left?")
    expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(1, timeout=60_000)
    assert applied.count() == 0 and last_request_text(right) != "still on the left?"

    # The same with Confirm pressed by Enter: the next message goes to the right engine.
    tab_to(page, "#chat-settings-open-modal")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-settings")).to_be_visible()
    pick_option(page, "backend", LABELS["right"])
    tab_to(page, "#confirm")
    page.keyboard.press("Enter")
    expect(applied.last).to_contain_text(LABELS["right"], timeout=30_000)
    type_message(page, "now on the right?")
    wait_for_request(right, "now on the right?")
    expect(page.locator('[data-testid="metrics"][data-state="completed"]')).to_have_count(2, timeout=60_000)
    expect(page.locator('[data-testid="metrics-backend"]').last).to_have_text(LABELS["right"])
    assert last_request_text(left) == "still on the left?"


def test_stop_works_from_the_keyboard(page: Page, chat_app: AppServer, pair):
    left, _ = pair
    page.goto(chat_app.url)
    wait_ready(page)
    left.set_pace(20, 400)  # 20 s of reply: it is still streaming when Stop is pressed
    try:
        type_message(page, "a long answer, please")
        reply = page.locator('[data-testid="metrics"]').last
        expect(reply).to_have_attribute("data-state", "streaming", timeout=60_000)
        expect(reply.locator('[data-testid="metrics-tokens"] .font-mono')).not_to_have_text("0", timeout=30_000)
        tab_to(page, "#stop-button")
        page.keyboard.press("Enter")
        expect(reply).to_have_attribute("data-state", "stopped", timeout=30_000)
        deadline = time.monotonic() + 30
        while not left.requests()[-1]["closed_by_client"]:
            assert time.monotonic() < deadline, "the engine's stream was never closed"
            time.sleep(0.1)
        shown = int(reply.locator('[data-testid="metrics-tokens"] .font-mono').inner_text().split()[0])
        assert 0 < shown < 400, shown  # stopped part-way: the rest was never streamed
    finally:
        left.set_pace(200, 12)


@pytest.fixture(scope="module")
def blind_app(app_factory, pair, tmp_path_factory) -> AppServer:
    return app_factory(pair_env(pair, tmp_path_factory, "keyboard-blind", DEFAULT_MODE="blind"),
                       name="chainlit-keyboard-blind")


def test_a_blind_vote_is_cast_from_the_keyboard(page: Page, blind_app: AppServer):
    page.goto(blind_app.url)
    wait_ready(page)
    type_message(page, "Which of you explains TTFT better?")
    grid = page.locator('[data-testid="compare"]').last
    expect(grid).to_have_attribute("data-final", "true", timeout=60_000)
    assert grid.get_attribute("data-revealed") == "false"
    # Focus on the vote, not yet pressed: nothing is stored (the control).
    tab_to(page, '[data-testid="vote-B"]', backwards=True)
    time.sleep(0.5)
    database = blind_app.env["DATABASE_URL"]
    assert stored_when(database, "votes", until=lambda votes: True) == []
    page.keyboard.press("Space")
    expect(page.locator('[data-testid="vote-summary"]').last).to_contain_text("B better", timeout=30_000)
    expect(grid).to_have_attribute("data-revealed", "true", timeout=30_000)
    (record,) = stored_when(database, "votes", until=lambda votes: len(votes) == 1)
    assert record.vote.outcome == "win" and record.vote.winner_label == "B"


# The figures' announcement: a visually hidden polite live region (role="status") inside the
# figures, changed when the first token arrives and when the reply ends, never on every tick.
RECORD_ANNOUNCEMENTS_JS = """
() => {
  window.__announced = [];  // each distinct text of the newest reply's live region, in order
  window.__figureTexts = [];  // each distinct text of its visible token count (the control)
  window.__regionHidden = [];
  const read = () => {
    const figures = [...document.querySelectorAll('[data-testid="metrics"]')].pop();
    if (!figures) return;
    const region = figures.querySelector('[aria-live="polite"][role="status"]');
    const text = region ? region.textContent.trim() : null;
    if (region && text && text !== window.__announced[window.__announced.length - 1]) {
      window.__announced.push(text);
      const box = region.getBoundingClientRect();
      window.__regionHidden.push(box.width <= 1 || box.height <= 1);
    }
    const cell = figures.querySelector('[data-testid="metrics-tokens"] .font-mono');
    const shown = cell ? cell.innerText.trim() : null;
    if (shown && shown !== window.__figureTexts[window.__figureTexts.length - 1]) window.__figureTexts.push(shown);
  };
  new MutationObserver(read).observe(document.body,
    {subtree: true, childList: true, characterData: true, attributes: true});
}
"""


def test_live_figures_are_announced_politely_at_the_first_token_and_the_end_only(
        page: Page, chat_app: AppServer, pair):
    left, _ = pair
    page.goto(chat_app.url)
    wait_ready(page)
    left.set_pace(25, 100)  # 4 s of reply: some 40 refreshes of the visible figures
    try:
        page.evaluate(RECORD_ANNOUNCEMENTS_JS)
        type_message(page, "announce my figures")
        reply = page.locator('[data-testid="metrics"]').last
        expect(reply).to_have_attribute("data-state", "completed", timeout=60_000)
        page.wait_for_timeout(500)  # the last update after the final figures
    finally:
        left.set_pace(200, 12)
    figure_texts = page.evaluate("() => window.__figureTexts")
    announced = page.evaluate("() => window.__announced")
    # Control: the visible figures did change on many ticks over this reply.
    assert len(figure_texts) >= 10, figure_texts
    assert announced, "no polite live region (role=status) with text in the reply's figures"
    assert len(announced) <= 3, f"announced {len(announced)} times: {announced}"
    assert all(page.evaluate("() => window.__regionHidden")), "the live region is visible on screen"
    final = announced[-1]
    for cell in ("metrics-ttft", "metrics-rate", "metrics-tokens"):
        value = reply.locator(f'[data-testid="{cell}"] .font-mono').inner_text().strip()
        assert value in final, f"the last announcement {final!r} lacks the final {cell} {value!r}"
