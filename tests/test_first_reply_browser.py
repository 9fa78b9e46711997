"""The first reply of a fresh app, sent from a real browser, carries none of the app's first-time costs.

The page loads and sits 3 s, as in a class, then the first message goes. Its TTFT as the app shows
and stores it is set against the paced server's own (first send minus arrival). The goal (+15 ms)
is judged by experiments/first_reply_browser.py on a quiet machine (measured: +1.1 ms in each of
three fresh apps); here the bound is a safety bound a busy CI machine keeps, yet one the app failed
before its chunks were stamped where they arrive (+28 to +75 ms over the truth).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from experiments.first_reply_browser import biases_in_browser
from servers.app import backend_env
from servers.paced_openai import start_paced_server

pytestmark = pytest.mark.slow

FIRST_TOKEN_S = 0.4
SAFETY_BOUND_MS = 25.0


@pytest.fixture(scope="module")
def paced():
    server = start_paced_server(100, 40, name="paced-first-reply-browser")
    server.set_pace(100, 40, first_token_s=FIRST_TOKEN_S)
    yield server
    server.stop()


def test_the_first_reply_of_a_fresh_app_from_a_browser_shows_the_servers_ttft(page: Page, app_factory, paced,
                                                                              tmp_path):
    app = app_factory({"BACKENDS": "paced", "DEFAULT_BACKEND": "paced", "DEFAULT_SYSTEM_PROMPT": "none",
                       "DEFAULT_MAX_NEW_TOKENS": "40", "DATABASE_URL": f"sqlite:///{tmp_path / 'lab.db'}",
                       **backend_env("paced", kind="vllm", base_url=paced.base_url, label="Paced")},
                      name="chainlit-first-reply-browser")
    first, warm = biases_in_browser(page, paced, app, 2, idle_s=3.0)
    # Never below the truth (the app's clock starts before the request's first byte leaves) ...
    assert first >= 0 and warm >= 0, (first, warm)
    # ... and the first reply no later than a safety bound over it, like a warm one.
    assert first <= SAFETY_BOUND_MS and warm <= SAFETY_BOUND_MS, (first, warm)
