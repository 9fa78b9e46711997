"""Does every backend kind show the same figures for the same stream?

Two paced servers with known send times stand in for the engines: the
OpenAI-protocol test server (kinds "openai" and "vllm") and the TGI-protocol
test server's paced engine (both TGI routes). Each streams `--tokens` tokens
at `--rate` tokens/s after a `--first-token-ms` delay and records, per
request, when it handed its first and last token to the transport. For each
kind this prints, over `--requests` sequential requests:

- TTFT bias: shown TTFT minus the server's own TTFT (its first send after
  the request arrived), median and max, in ms: everything the client adds,
  before sending (client set-up, connecting, lookups) and after receiving
  (parsing). Goal: median <= +15 ms.
- decode rate ratio: shown decode tokens/s over the server's own pace between
  its first and last send, min and max. Goal: within 2 %.
- exact counts: requests whose shown token count equals what the server sent.
- ITL median: each request's median inter-token latency over the server's
  pace (1000/rate ms), the median over the requests (a request whose tokens
  came in bursts shows far under 1). Goal: within 50 %.

Each kind's goals end in a verdict: the script exits 1 naming every missed
goal (bench/verdict.py). A last row, not judged, measures the path the app used before (a new huggingface_hub
`AsyncInferenceClient` per request, TGI Messages API), to show what a
per-request client costs.

Run: `.venv/bin/python -m experiments.measurement_parity [--requests 10] [--rate 200] [--tokens 100]`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

from huggingface_hub import AsyncInferenceClient

from backends.base import ChatMessage, GenerationParams, StreamChunk
from backends.openai_compat import OpenAICompatBackend
from backends.tgi import TGIBackend
from bench.verdict import Goal, all_of, at_most, exit_status, within_ratio
from config import BackendConfig
from core.streaming import measure
from core.timing import RequestRecord, TimedStream
from servers.paced_openai import start_paced_server
from servers.tgi_protocol import start_paced_tgi_server

KINDS = ("openai", "vllm", "tgi messages", "tgi generate")
TTFT_BIAS_GOAL_MS = 15.0  # the README's claim for every kind
DECODE_RATE_TOLERANCE = 0.02  # shown decode tokens/s within 2 % of the server's pace
ITL_MEDIAN_TOLERANCE = 0.5  # the requests' median inter-token latency within 50 % of the pace


def row(label: str, biases_ms: list[float], ratios: list[float], exact: int, total: int) -> str:
    return (f"{label:<34} {statistics.median(biases_ms):>8.1f} {max(biases_ms):>8.1f} "
            f"{min(ratios):>8.4f} {max(ratios):>8.4f} {exact:>4}/{total}")


def kind_goals(kind: str, biases_ms: list[float], ratios: list[float], exact: int, total: int,
               itl_ratios: list[float] = ()) -> list[Goal]:
    """The goals one kind must meet: median TTFT bias within +15 ms, every request's decode rate
    within 2 % of the server's pace, every token count exact, the requests' median ITL within 50 % of the pace."""
    return [
        at_most(f"{kind}: TTFT bias, median", statistics.median(biases_ms) if biases_ms else None,
                TTFT_BIAS_GOAL_MS, unit="ms"),
        within_ratio(f"{kind}: decode rate / server's pace, lowest", min(ratios) if ratios else None,
                     DECODE_RATE_TOLERANCE, digits=4),
        within_ratio(f"{kind}: decode rate / server's pace, highest", max(ratios) if ratios else None,
                     DECODE_RATE_TOLERANCE, digits=4),
        all_of(f"{kind}: exact token counts", exact, total),
        within_ratio(f"{kind}: ITL median / pace, median", statistics.median(itl_ratios) if itl_ratios else None,
                     ITL_MEDIAN_TOLERANCE, digits=3),
    ]


def compare(record: RequestRecord, sent: dict) -> tuple[float, float, bool]:
    bias_ms = (record.first_token_s - (sent["first_token_sent_at_s"] - sent["received_at_s"])) * 1000
    server_rate = (sent["tokens_sent"] - 1) / (sent["last_token_sent_at_s"] - sent["first_token_sent_at_s"])
    return bias_ms, record.decode_tokens_per_s / server_rate, record.output_tokens == sent["tokens_sent"]


async def tgi_sent(tgi_server) -> dict:
    """The TGI server's record of the latest generation, with when its request arrived."""
    generation = (await tgi_server.generations())[-1]
    return {**generation, "received_at_s": (await tgi_server.requests())[-1]["received_at_s"]}


async def per_request_hub_client(url: str, messages: list[ChatMessage], max_tokens: int):
    """The old TGI path: a new AsyncInferenceClient for every request (its set-up is inside TTFT)."""
    client = AsyncInferenceClient(model=url, headers={"authorization": None})
    try:
        events = await client.chat_completion([m.as_dict() for m in messages], model="tgi", stream=True,
                                              stream_options={"include_usage": True}, max_tokens=max_tokens)
        async for event in events:
            for choice in event.choices:
                yield StreamChunk(text=choice.delta.content or "", token_count=1 if choice.delta.content else 0)
    finally:
        await client.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10, help="requests per kind (default 10)")
    parser.add_argument("--rate", type=float, default=200.0, help="server pace, tokens/s (default 200)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per reply (default 100)")
    parser.add_argument("--first-token-ms", type=float, default=50.0, help="server delay before the first token")
    args = parser.parse_args()

    openai_server = start_paced_server(args.rate, args.tokens, name="bench-paced-openai")
    openai_server.set_pace(args.rate, args.tokens, first_token_s=args.first_token_ms / 1000)
    tgi_server = start_paced_tgi_server(args.rate, args.tokens, args.first_token_ms / 1000, name="bench-paced-tgi")
    backends = {
        "openai": OpenAICompatBackend(BackendConfig(name="openai", kind="openai", label="openai",
                                                    base_url=openai_server.base_url)),
        "vllm": OpenAICompatBackend(BackendConfig(name="vllm", kind="vllm", label="vllm",
                                                  base_url=openai_server.base_url)),
        "tgi messages": TGIBackend(BackendConfig(name="tgi", kind="tgi", label="tgi", base_url=tgi_server.url,
                                                 options={"route": "messages"})),
        "tgi generate": TGIBackend(BackendConfig(name="tgi", kind="tgi", label="tgi", base_url=tgi_server.url,
                                                 options={"route": "generate"})),
    }
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=args.tokens)
    print(f"paced servers: {args.rate:g} tokens/s, {args.tokens} tokens, first token after {args.first_token_ms:g} ms; "
          f"{args.requests} sequential requests per kind")
    goals: list[Goal] = []
    print(f"{'kind':<34} {'TTFT bias ms':>17} {'decode rate ratio':>17} {'exact':>9}")
    print(f"{'':<34} {'median':>8} {'max':>8} {'min':>8} {'max':>8}")
    try:
        for kind in KINDS:
            backend = backends[kind]
            biases, ratios, exact, itl_ratios = [], [], 0, []
            for index in range(args.requests):
                _, record = await measure(backend, [ChatMessage("user", f"request {index}")], params)
                itl_ratios.append(record.itl.median_ms / (1000 / args.rate) if record.itl else float("nan"))
                sent = openai_server.requests()[-1] if kind in ("openai", "vllm") else await tgi_sent(tgi_server)
                bias, ratio, same = compare(record, sent)
                biases.append(bias)
                ratios.append(ratio)
                exact += same
            print(row(kind, biases, ratios, exact, args.requests))
            goals += kind_goals(kind, biases, ratios, exact, args.requests, itl_ratios)

        biases, ratios, exact = [], [], 0
        for index in range(args.requests):
            messages = [ChatMessage("user", f"old path {index}")]
            timed = TimedStream(per_request_hub_client(tgi_server.url, messages, args.tokens),
                                backend="old", model="paced")
            async for _ in timed:
                pass
            await timed.aclose()
            record = timed.finish("completed")
            bias, ratio, same = compare(record, await tgi_sent(tgi_server))
            biases.append(bias)
            ratios.append(ratio)
            exact += same
        print(row("tgi messages, client per request", biases, ratios, exact, args.requests) + "   (before; not judged)")
    finally:
        for backend in backends.values():
            await backend.aclose()
        openai_server.stop()
        tgi_server.process.stop()
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
