"""The newcomer's first run, checked from outside: one real reply from the embedded default.

    python -m load.first_reply http://127.0.0.1:PORT [--timeout-s 300]

What a person does after README command 1, as a browser tab on Chainlit's
socket.io protocol (`load.chainlit_client`): the page loads, a chat opens,
its backend list says the embedded llama.cpp model is ready, `/status`
probes every backend and says it again, and a real message gets a streamed
reply from it whose final figures say it completed, with a time to first
token and a token count. Exit 0 when all of that held; 1 naming each thing
that did not (`.ci/run` runs it before any test tool is installed, so a
package the app needs but does not declare fails here with the app's log).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Iterable

import requests

from load.chainlit_client import ChainlitClient, ChatFailed, ReplyRecord, user_message

PROMPT = "In one short sentence, what is a large language model?"
EMBEDDED_KIND_LABEL = "llama.cpp (embedded)"  # config.py's default label of the embedded kind
READY_MARK = "✅"


def backend_ready_in(text: str, label: str = EMBEDDED_KIND_LABEL) -> bool:
    """Whether a backend list (chat start, or /status) says `label` is ready: its line starts with ✅."""
    return any(line.lstrip("- ").startswith(f"{READY_MARK} **{label}**") for line in text.splitlines())


def final_figures(events: Iterable[tuple[float, str, Any]], message_id: str | None = None) -> dict | None:
    """The last figures element (props) sent for the reply, or None if none came."""
    last = None
    for _, event, data in events:
        if event == "element" and isinstance(data, dict) and data.get("name") == "Metrics":
            props = data.get("props")
            if isinstance(props, dict) and props.get("kind") is None and (
                    message_id is None or data.get("forId") == message_id):
                last = props
    return last


def first_run_problems(startup_text: str, status_text: str, reply: ReplyRecord, figures: dict | None) -> list[str]:
    """What a newcomer would find broken (empty: the first run works)."""
    problems = []
    if not backend_ready_in(startup_text):
        problems.append(f"the new chat's backend list does not say {EMBEDDED_KIND_LABEL} is ready: {startup_text[:500]!r}")
    if not backend_ready_in(status_text):
        problems.append(f"/status does not say {EMBEDDED_KIND_LABEL} is ready: {status_text[:500]!r}")
    if not reply.ok:
        problems.append(f"no reply: outcome {reply.outcome}, {(reply.error or reply.text)[:500]!r}")
    if figures is None:
        problems.append("the reply came without its figures")
    else:
        if figures.get("state") != "completed":
            problems.append(f"the reply's figures say {figures.get('state')!r}, not completed")
        if not figures.get("ttftMs"):
            problems.append("the reply's figures have no time to first token")
        if not figures.get("tokens") or not figures.get("tokensExact"):
            problems.append(f"the reply's figures have no exact token count ({figures.get('tokens')!r})")
        if EMBEDDED_KIND_LABEL not in str(figures.get("backend")):
            problems.append(f"the reply came from {figures.get('backend')!r}, not the embedded default")
    return problems


def check(base_url: str, timeout_s: float) -> int:
    started = time.monotonic()
    page = requests.get(base_url + "/", timeout=30)
    print(f"GET / -> HTTP {page.status_code}")
    if page.status_code != 200:
        print(f"FAILED: the page answered HTTP {page.status_code}", file=sys.stderr)
        return 1
    client = ChainlitClient(base_url, record_events=True)
    try:
        ready_s = client.open_chat(timeout_s)
        startup = "\n".join(client.tracker.startup_messages.values())
        print(f"chat ready in {ready_s:.1f} s over {client.transport} (it loads the embedded model)")
        # /status typed as a message: it probes every backend now and lists them again.
        status_text = client.emit_for_message("client_message", user_message("/status", base_url + "/"), timeout_s=60)
        reply = client.ask(PROMPT, timeout_s)
    except ChatFailed as error:
        print(f"FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    figures = final_figures(client.events or [])
    if reply.ok:
        print(f"reply in {reply.reply_s:.1f} s (first text after {reply.first_token_s:.2f} s): {reply.text[:200]!r}")
    if figures:
        print(f"figures: {figures.get('state')}, TTFT {figures.get('ttftMs')} ms, {figures.get('tokens')} tokens, "
              f"{figures.get('tokensPerS')} tokens/s, {figures.get('backend')}")
    problems = first_run_problems(startup, status_text, reply, figures)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if not problems:
        print(f"The first run works: page, chat, backend ready, /status, one real reply "
              f"({time.monotonic() - started:.1f} s in all).")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the running app, e.g. http://127.0.0.1:8000")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="for the chat to open and for the reply")
    args = parser.parse_args(argv)
    return check(args.url.rstrip("/"), args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
