"""The first reply is measured as fairly as the rest: TTFT through the app against known send times.

A class meets the cold app first, so its first reply must not carry a
one-time cost (an import, the first use of a parser, a connection, the first
call into an SDK) inside its measured time. For every HTTP kind (openai,
vllm, TGI Messages API, TGI native) this starts a paced server whose true
TTFT is `--first-token-ms` (one server per kind, so each request is its
own), then a fresh app (`chainlit run app.py --headless`) with that one
backend, and as a browser tab on Chainlit's socket.io (load/chainlit_client)
sends the first message and `--warm` more. Each reply's TTFT as the app shows
it (its final figures) is set against the server's own record: the first
send after the request arrived. Then a fresh app with all four kinds in one
blind round, run sequentially, whose columns are each that backend's first
request (read from the app's database, as /stats would after the vote); the
servers are slow enough (`--round-tokens` at `--rate`) that a column prepared
at the round's start would have waited past the servers' keep-alive.

Goals, each with a verdict (exit 1 naming a miss): the first reply of each
kind, its warm replies' median and each first blind column within +15 ms of
the server's truth.

Run: `.venv/bin/python -m experiments.first_reply_parity [--warm 4] [--first-token-ms 400] [--rate 100]
      [--tokens 40] [--round-tokens 600]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.verdict import Goal, at_most, exit_status
from load.chainlit_client import ChainlitClient
from load.first_reply import final_figures
from servers.app import backend_env, run_coroutine, start_app, stored
from servers.paced_openai import start_paced_server
from servers.tgi_protocol import start_paced_tgi_server

GOAL_MS = 15.0
KINDS = ("openai", "vllm", "tgi messages", "tgi generate")
NAMES = {"openai": "p_openai", "vllm": "p_vllm", "tgi messages": "p_tgi_messages", "tgi generate": "p_tgi_native"}
REPLY_TIMEOUT_S = 120.0
# The TGI server's routes that start a generation (its /chat_tokenize and /tokenize do not).
GENERATION_PATHS = ("/v1/chat/completions", "/generate_stream", "/generate", "/")


@dataclass
class Paced:
    """One paced server standing in for one kind, and how to read its truth."""

    kind: str
    server: object

    @property
    def env(self) -> dict[str, str]:
        name = NAMES[self.kind]
        if self.kind in ("openai", "vllm"):
            return backend_env(name, kind=self.kind, base_url=self.server.base_url, label=f"Paced {self.kind}")
        route = "messages" if self.kind == "tgi messages" else "generate"
        return backend_env(name, kind="tgi", base_url=self.server.url, label=f"Paced {self.kind}", route=route)

    def truths_ms(self) -> list[float]:
        """The server's own TTFT of every request so far (first send - arrival), in ms."""
        if self.kind in ("openai", "vllm"):
            return [(r["first_token_sent_at_s"] - r["received_at_s"]) * 1000 for r in self.server.requests()
                    if r.get("first_token_sent_at_s")]
        generations = run_coroutine(self.server.generations())
        arrivals = run_coroutine(self.server.requests())
        chats = [r for r in arrivals if r.get("path") in GENERATION_PATHS]
        return [(g["first_token_sent_at_s"] - r["received_at_s"]) * 1000 for g, r in zip(generations, chats)
                if g.get("first_token_sent_at_s")]

    def stop(self) -> None:
        if self.kind in ("openai", "vllm"):
            self.server.stop()
        else:
            self.server.process.stop()


@dataclass
class KindResult:
    kind: str
    biases_ms: list[float] = field(default_factory=list)  # first, then warm
    round_bias_ms: float | None = None


def start_servers(args) -> dict[str, Paced]:
    """One paced server per kind, each streaming up to `--round-tokens` (a request's max new tokens
    cuts a chat reply to `--tokens`) after `--first-token-ms`."""
    servers: dict[str, Paced] = {}
    first_token_s = args.first_token_ms / 1000
    try:
        for kind in KINDS:
            if kind in ("openai", "vllm"):
                server = start_paced_server(args.rate, args.round_tokens, name=f"first-reply-{kind}")
                server.set_pace(args.rate, args.round_tokens, first_token_s=first_token_s)
            else:
                server = start_paced_tgi_server(args.rate, args.round_tokens, first_token_s,
                                                name=f"first-reply-{kind.replace(' ', '-')}")
            servers[kind] = Paced(kind, server)
    except BaseException:
        for paced in servers.values():
            paced.stop()
        raise
    return servers


def app_env(database_url: str, **more: str) -> dict[str, str]:
    return {"DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_TEMPERATURE": "0.7", "DATABASE_URL": database_url,
            "AUTH_USERS": "", **more}


def chat_replies(paced: Paced, count: int, work: Path, tokens: int) -> list[float]:
    """A fresh app with this one backend: TTFT bias (shown - truth, ms) of each of `count` replies."""
    name = NAMES[paced.kind]
    env = app_env(f"sqlite:///{work / (name + '.db')}", BACKENDS=name, DEFAULT_BACKEND=name,
                  DEFAULT_MAX_NEW_TOKENS=str(max(16, tokens)), **paced.env)
    app = start_app(env, name=f"first-reply-app-{name}")
    biases = []
    try:
        client = ChainlitClient(app.url, record_events=True)
        try:
            client.open_chat(REPLY_TIMEOUT_S)
            for index in range(count):
                seen = len(paced.truths_ms())
                record = client.ask(f"Reply number {index}, please.", REPLY_TIMEOUT_S)
                if not record.ok:
                    raise RuntimeError(f"{paced.kind}: reply {index} failed: {record.error or record.outcome}")
                figures = final_figures(client.events)
                truths = paced.truths_ms()
                if len(truths) != seen + 1:
                    raise RuntimeError(f"{paced.kind}: the server saw {len(truths) - seen} requests for one reply")
                biases.append(figures["ttftMs"] - truths[-1])
        finally:
            client.close()
    finally:
        app.stop()
    return biases


def first_blind_round(servers: dict[str, Paced], work: Path, round_tokens: int) -> dict[str, float]:
    """A fresh app, one blind round over every kind, sequential: each column's TTFT bias (ms)."""
    names = [NAMES[kind] for kind in KINDS]
    env = app_env(f"sqlite:///{work / 'round.db'}", BACKENDS=",".join(names), DEFAULT_MODE="blind",
                  DEFAULT_COMPARE_BACKENDS=",".join(names), DEFAULT_RUN_ORDER="sequential",
                  DEFAULT_MAX_NEW_TOKENS=str(round_tokens))
    for paced in servers.values():
        env.update(paced.env)
    before = {kind: len(paced.truths_ms()) for kind, paced in servers.items()}
    app = start_app(env, name="first-reply-app-round")
    try:
        client = ChainlitClient(app.url)
        try:
            client.open_chat(REPLY_TIMEOUT_S)
            record = client.ask("One round, please.", REPLY_TIMEOUT_S * 4)
            if record.outcome not in ("replied", "empty"):  # a round's text is in its element, not a message
                raise RuntimeError(f"the blind round failed: {record.error or record.outcome}")
        finally:
            client.close()
        deadline = time.monotonic() + 30
        while True:
            replies = run_coroutine(stored(env["DATABASE_URL"], "replies", 10))
            if len(replies) >= len(names) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        app.stop()
    by_name = {reply.backend: reply for reply in replies}
    biases = {}
    for kind, paced in servers.items():
        truths = paced.truths_ms()[before[kind]:]
        reply = by_name.get(NAMES[kind])
        if reply is None or reply.first_token_s is None or len(truths) != 1:
            raise RuntimeError(f"{kind}: the round's column was not measured ({len(truths)} requests seen)")
        biases[kind] = reply.first_token_s * 1000 - truths[0]
    return biases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=4, help="warm replies after the first, per kind (4)")
    parser.add_argument("--first-token-ms", type=float, default=400.0, help="the servers' true TTFT (400)")
    parser.add_argument("--rate", type=float, default=100.0, help="tokens/s of every server (100)")
    parser.add_argument("--tokens", type=int, default=40, help="tokens per chat reply (40)")
    parser.add_argument("--round-tokens", type=int, default=600,
                        help="tokens per column in the blind round (600: 6 s per column at 100/s)")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = {kind: KindResult(kind) for kind in KINDS}
    servers = start_servers(args)
    try:
        with tempfile.TemporaryDirectory(prefix="first-reply-") as work:
            for kind in KINDS:
                results[kind].biases_ms = chat_replies(servers[kind], 1 + args.warm, Path(work), args.tokens)
                print(f"{kind:<14} first {results[kind].biases_ms[0]:+7.1f} ms, warm "
                      + " ".join(f"{b:+.1f}" for b in results[kind].biases_ms[1:]), flush=True)
            for kind, bias in first_blind_round(servers, Path(work), args.round_tokens).items():
                results[kind].round_bias_ms = bias
    finally:
        for paced in servers.values():
            paced.stop()

    print(f"\nTTFT shown by the app minus the server's own (true TTFT {args.first_token_ms:g} ms), in ms")
    print(f"{'kind':<14} {'first reply':>12} {'warm median':>12} {'warm max':>9} {'first blind column':>19}")
    goals: list[Goal] = []
    for kind, result in results.items():
        first, warm = result.biases_ms[0], result.biases_ms[1:]
        warm_median = statistics.median(warm) if warm else None
        print(f"{kind:<14} {first:>+12.1f} {warm_median or 0:>+12.1f} {max(warm or [0]):>+9.1f} "
              f"{result.round_bias_ms or 0:>+19.1f}")
        goals += [at_most(f"{kind}: first reply's TTFT bias", first, GOAL_MS, unit="ms"),
                  at_most(f"{kind}: warm replies' TTFT bias, median", warm_median, GOAL_MS, unit="ms"),
                  at_most(f"{kind}: first blind round column's TTFT bias", result.round_bias_ms, GOAL_MS, unit="ms")]
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
