"""Replies cannot reach out: images in a reply load only from the app's own origin or
LAB_IMAGE_ORIGINS, in a real browser (Debian's chromium), in a chat reply and in a compare round.

Two small HTTP servers on loopback ports of their own stand for other sites: "elsewhere" (not
allowed) and "trusted" (listed in LAB_IMAGE_ORIGINS). Each records every request it gets and
answers with a picture, so an image it served would show. The paced stand-in server answers with
a reply full of images, streamed in small pieces (Markdown split mid-address): inline, without
alt text, a video, by reference, protocol-relative, inside a link, and in code; one from the
trusted site and one from the app itself. "elsewhere" must see no request at all, while it
streams and after; the page must report no blocked load of the app's own (its logo, avatars).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from playwright.sync_api import Page, expect

from servers.app import AppServer, backend_env
from servers.paced_openai import PacedServer
from tests.test_browser import new_reply_id, send, watch_reply
from tests.test_compare_browser import SNAPSHOT_JS as ROUND_JS, change_settings

pytestmark = pytest.mark.slow

PACED_MODEL = "paced-test-model"
READY_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_S = 60.0
SETTLE_S = 1.5  # after the reply ends: time for any late load to be attempted
# The smallest valid PNG (1x1), so a request that got through would draw a picture.
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
# Every blocked load the page reports (Content-Security-Policy), from its very first script on.
RECORD_VIOLATIONS_JS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation',
  (event) => window.__violations.push({uri: event.blockedURI, directive: event.effectiveDirective}));
"""


class Site:
    """An HTTP server on a loopback port of its own, standing for another site: it records the
    path of every request and answers each with a PNG."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                site.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(PNG)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(PNG)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Site]:
    site = Site()
    yield site
    site.stop()


@pytest.fixture(scope="module")
def trusted() -> Iterator[Site]:
    site = Site()
    yield site
    site.stop()


@pytest.fixture(scope="module")
def images_app(app_factory, paced_server: PacedServer, trusted: Site) -> AppServer:
    env = {
        "BACKENDS": "paced,echo",
        "DEFAULT_BACKEND": "paced",
        "DEFAULT_SYSTEM_PROMPT": "none",
        "DEFAULT_MAX_NEW_TOKENS": "256",
        "DEFAULT_COMPARE_BACKENDS": "paced,echo",
        "DEFAULT_RUN_ORDER": "concurrent",
        "LAB_IMAGE_ORIGINS": trusted.origin,
        **backend_env("paced", kind="openai", base_url=paced_server.base_url, label="Paced"),
        **backend_env("echo", kind="openai", base_url=paced_server.base_url, label="Echo"),
    }
    return app_factory(env, name="chainlit-images-tests")


def reply_with_images(elsewhere: Site, trusted: Site, tag: str) -> str:
    far = elsewhere.origin
    return (f"Pictures for {tag}.\n\n"
            f"Inline: ![a cat]({far}/cat.png?{tag}) and without alt: ![]({far}/no-alt.png?{tag})\n\n"
            f"A clip: ![clip]({far}/clip.mp4?{tag})\n\n"
            f"By reference: ![a dog][dog]\n\n"
            f"Protocol-relative: ![p]({far.removeprefix('http:')}/relative.png?{tag})\n\n"
            f"In a link: [![badge]({far}/badge.svg?{tag})](https://ci.example/{tag})\n\n"
            f"Trusted: ![ok]({trusted.origin}/ok.png?{tag}) and the app's own: ![own](/favicon)\n\n"
            f"As code: `![code]({far}/code.png)`\n\n"
            f"[dog]: {far}/dog.png?{tag}\n")


def open_chat(page: Page, app: AppServer) -> None:
    page.add_init_script(RECORD_VIOLATIONS_JS)
    page.goto(app.url)
    expect(page.locator('.step[data-step-type="assistant_message"]', has_text=PACED_MODEL).first).to_be_visible(
        timeout=READY_TIMEOUT_MS)


# What a part of the page shows of images: the ones it draws (and whether they loaded), the links.
IMAGES_IN_JS = """
(selector) => {
  const parts = [...document.querySelectorAll(selector)];
  const root = parts[parts.length - 1];
  if (!root) return null;
  return {
    drawn: [...root.querySelectorAll('img, video')].map((e) => ({
      src: e.getAttribute('src') || '', loaded: e.tagName === 'IMG' ? e.complete && e.naturalWidth > 0 : null})),
    links: [...root.querySelectorAll('a[href]')].map((a) => ({href: a.getAttribute('href'), text: a.innerText})),
    code: [...root.querySelectorAll('code')].map((c) => c.innerText),
  };
}
"""


def assert_nothing_reached(app: AppServer, elsewhere: Site, trusted: Site, page: Page, tag: str, *,
                           drawn_while_streaming: bool) -> None:
    """No request reached the other site; the trusted one served its picture (so a load would have
    been seen); the page blocked no load of the app's own (its logo, avatars, data: and blob: URLs).
    (It blocks more than the other site's full addresses: while a reply streams, a reference
    image can point at a half-written definition, e.g. http://127 .)"""
    time.sleep(SETTLE_S)
    assert elsewhere.paths == [], f"the browser asked the other site for {elsewhere.paths}"
    assert f"/ok.png?{tag}" in trusted.paths, trusted.paths
    violations = page.evaluate("window.__violations")
    if drawn_while_streaming:  # a chat reply's streamed text is drawn as it comes: the policy blocks
        assert violations, "the page blocked nothing: was the reply's image from elsewhere ever drawn?"
    blocked_of_the_app = [v for v in violations
                          if v["uri"].startswith((app.url, "data:", "blob:")) or v["uri"] in ("", "inline", "self")]
    assert blocked_of_the_app == [], blocked_of_the_app


def test_the_sites_standing_in_for_other_hosts_would_see_an_image_load(page: Page, elsewhere: Site, trusted: Site):
    """Without the app's page policy, a page loads both sites' pictures: what the tests below count."""
    page.set_content(f'<img src="{elsewhere.origin}/probe.png"><img src="{trusted.origin}/probe.png">')
    page.wait_for_function("[...document.images].every((i) => i.complete && i.naturalWidth > 0)")
    assert "/probe.png" in elsewhere.paths and "/probe.png" in trusted.paths
    elsewhere.paths.clear()
    trusted.paths.clear()


def test_a_chat_reply_with_images_from_elsewhere_makes_no_request_to_their_host(
        page: Page, images_app: AppServer, paced_server: PacedServer, elsewhere: Site, trusted: Site):
    paced_server.set_reply(text=reply_with_images(elsewhere, trusted, "chat"), rate_tokens_per_s=100)
    try:
        open_chat(page, images_app)
        send(page, "Show me some pictures")
        reply = new_reply_id(page, None)
        assert watch_reply(page, reply)[-1]["state"] == "completed"
        assert_nothing_reached(images_app, elsewhere, trusted, page, "chat", drawn_while_streaming=True)
        shown = page.evaluate(IMAGES_IN_JS, '.step[data-step-type="assistant_message"] .message-content')
        drawn = {image["src"]: image["loaded"] for image in shown["drawn"]}
        assert drawn.get(f"{trusted.origin}/ok.png?chat") and drawn.get("/favicon"), drawn
        assert f"![code]({elsewhere.origin}/code.png)" in shown["code"]
    finally:
        paced_server.set_pace(rate_tokens_per_s=50, tokens=60)


def test_a_chat_reply_shows_each_image_from_elsewhere_as_a_link_with_its_address(
        page: Page, images_app: AppServer, paced_server: PacedServer, elsewhere: Site, trusted: Site):
    paced_server.set_reply(text=reply_with_images(elsewhere, trusted, "links"), rate_tokens_per_s=200)
    try:
        open_chat(page, images_app)
        send(page, "Show me some pictures")
        assert watch_reply(page, new_reply_id(page, None))[-1]["state"] == "completed"
        selector = '.step[data-step-type="assistant_message"] .message-content'
        far = elsewhere.origin
        # The final text replaces the streamed one a moment after the figures say "completed".
        expect(page.locator(selector).last.locator(f'a[href="{far}/cat.png?links"]')).to_have_count(1)
        assert_links_for_every_image_from_elsewhere(page.evaluate(IMAGES_IN_JS, selector), elsewhere, "links")
        assert elsewhere.paths == []
    finally:
        paced_server.set_pace(rate_tokens_per_s=50, tokens=60)


def test_a_compare_round_shows_images_from_elsewhere_as_links_and_makes_no_request_to_their_host(
        page: Page, images_app: AppServer, paced_server: PacedServer, elsewhere: Site, trusted: Site):
    paced_server.set_reply(text=reply_with_images(elsewhere, trusted, "round"), rate_tokens_per_s=100)
    try:
        open_chat(page, images_app)
        change_settings(page, mode="Compare side by side")
        send(page, "Show me some pictures")
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not ((round_ := page.evaluate(ROUND_JS, False)) and round_["final"]):
            assert time.monotonic() < deadline, f"the round did not finish: {round_}"
            time.sleep(0.1)
        assert [column["state"] for column in round_["columns"]] == ["completed", "completed"], round_
        assert_nothing_reached(images_app, elsewhere, trusted, page, "round", drawn_while_streaming=False)
        for label in ("A", "B"):
            shown = page.evaluate(IMAGES_IN_JS, f'[data-testid="compare"] [data-testid="column-{label}"] '
                                                f'[data-testid="column-text"]')
            assert_links_for_every_image_from_elsewhere(shown, elsewhere, "round")
            drawn = {image["src"]: image["loaded"] for image in shown["drawn"]}
            assert drawn == {f"{trusted.origin}/ok.png?round": True, "/favicon": True}, drawn
    finally:
        paced_server.set_pace(rate_tokens_per_s=50, tokens=60)


def assert_links_for_every_image_from_elsewhere(shown: dict, elsewhere: Site, tag: str) -> None:
    """No picture or video from the other site is drawn; each is a link whose text is its address
    (the one inside a link is that link's text); the one in code stays code."""
    far = elsewhere.origin
    assert not [image for image in shown["drawn"]
                if image["src"].startswith((far, far.removeprefix("http:")))], shown["drawn"]
    links = {link["href"]: link["text"] for link in shown["links"]}
    for path in ("cat.png", "no-alt.png", "clip.mp4", "dog.png"):
        address = f"{far}/{path}?{tag}"
        assert address in links.get(address, ""), (address, links)
    relative = f"{far.removeprefix('http:')}/relative.png?{tag}"
    assert relative in links.get(relative, ""), (relative, links)
    assert f"{far}/badge.svg?{tag}" in links.get(f"https://ci.example/{tag}", ""), links
    assert f"![code]({far}/code.png)" in shown["code"], shown["code"]
