"""What each reply's prompt cost, as the page shows it: prompt tokens, how many came from the engine's
cache, and the prefill speed, in the reply's row (the embedded model, a real llama.cpp), and "not
reported" where an engine says nothing (the paced OpenAI-protocol stand-in sends no cache figures)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from servers.app import backend_env
from servers.paced_openai import start_paced_server
from tests.test_browser import REPLY_TIMEOUT_MS, send, switch_backend

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def paced():
    server = start_paced_server(200, 8, name="paced-prompt-cost")
    yield server
    server.stop()


def finished(page: Page):
    return page.locator('[data-testid="metrics"][data-state="completed"]')


def cell(page: Page, index: int, testid: str) -> str:
    return finished(page).nth(index).locator(f'[data-testid="{testid}"] .font-mono').inner_text().strip()


def test_the_second_turn_shows_its_prompt_taken_from_the_embedded_models_cache(page: Page, app_factory, paced,
                                                                                tmp_path):
    app = app_factory({"BACKENDS": "llama_cpp,paced", "DEFAULT_BACKEND": "llama_cpp", "DEFAULT_MAX_NEW_TOKENS": "16",
                       "DEFAULT_TEMPERATURE": "0", "DEFAULT_SYSTEM_PROMPT": "none",
                       "DATABASE_URL": f"sqlite:///{tmp_path / 'lab.db'}",
                       **backend_env("paced", kind="openai", base_url=paced.base_url, label="Paced")},
                      name="chainlit-prompt-cost")
    page.goto(app.url)
    page.get_by_text("Backends", exact=True).wait_for(timeout=120_000)
    send(page, "Name one color.")
    expect(finished(page)).to_have_count(1, timeout=REPLY_TIMEOUT_MS)
    send(page, "Name another one.")
    expect(finished(page)).to_have_count(2, timeout=REPLY_TIMEOUT_MS)
    first, second = cell(page, 0, "metrics-prompt"), cell(page, 1, "metrics-prompt")
    pattern = re.compile(r"^(\d+) · (\d+) cached$")
    (tokens_1, cached_1), (tokens_2, cached_2) = (map(int, pattern.match(text).groups()) for text in (first, second))
    # The second turn carries the first (question and reply): the model kept that prefix and reused it.
    assert tokens_2 > tokens_1 and cached_2 >= tokens_1 - 2 and cached_2 > cached_1, (first, second)
    assert re.match(r"^\d+$", cell(page, 1, "metrics-prefill")), cell(page, 1, "metrics-prefill")

    # An engine that reports prompt tokens but nothing about a cache or prefill says so.
    switch_backend(page, "Paced (paced)", "Paced")
    send(page, "And one more.")
    expect(finished(page)).to_have_count(3, timeout=REPLY_TIMEOUT_MS)
    assert re.match(r"^\d+ · cache not reported$", cell(page, 2, "metrics-prompt")), cell(page, 2, "metrics-prompt")
    assert cell(page, 2, "metrics-prefill") == "not reported"
