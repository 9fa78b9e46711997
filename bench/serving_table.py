"""The comparison table: TTFT, ms per output token and tokens/s at 1 and N concurrent requests.

Uses the app's own backends (from .env, like the chat) and the same timing
module as the UI, so the table and the chat figures agree by construction.

    .venv/bin/python -m bench.serving_table                      # every configured backend
    .venv/bin/python -m bench.serving_table --backends llama_cpp,vllm --concurrency 1,8 --requests 8

Backends that are down are reported and skipped. Requests are bounded by
--requests and --max-new-tokens; everything targets the URLs in .env.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import ChatMessage, GenerationParams  # noqa: E402
from backends.errors import BackendError  # noqa: E402
from backends.registry import Registry  # noqa: E402
from config import load_env  # noqa: E402
from timing import RequestRecord, measure  # noqa: E402

PROMPT = "Explain in a few paragraphs how a large language model generates text, token by token."


async def one_level(registry: Registry, name: str, concurrency: int, requests: int,
                    params: GenerationParams) -> tuple[list[RequestRecord], float, list[str]]:
    """Run `requests` requests with at most `concurrency` in flight; return records, wall time, errors."""
    backend = registry.get(name)
    info = await backend.info()
    gate = asyncio.Semaphore(concurrency)
    errors: list[str] = []

    async def single(index: int) -> RequestRecord | None:
        async with gate:
            messages = [ChatMessage("user", f"{PROMPT} (request {index})")]
            try:
                _, record = await measure(backend, messages, params)
            except BackendError as error:  # recorded, not raised: one failure must not hide the rest
                errors.append(error.describe())
                return None
            return record

    started = time.perf_counter()
    results = await asyncio.gather(*(single(i) for i in range(requests)))
    return [r for r in results if r is not None], time.perf_counter() - started, errors


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", help="comma-separated backend names (default: all configured)")
    parser.add_argument("--concurrency", default="1,8", help="levels, e.g. 1,8")
    parser.add_argument("--requests", type=int, default=8, help="requests per level (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    load_env()
    registry = Registry.from_env(dict(os.environ))
    names = args.backends.split(",") if args.backends else registry.names
    levels = [int(level) for level in args.concurrency.split(",")]
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    header = (f"{'backend':<24} {'model':<28} {'conc':>4} {'ok':>4} {'tokens':>6} {'TTFT ms':>9} {'ms/token':>9} "
              f"{'tok/s/req':>10} {'tok/s total':>12}")
    print(header)
    print("-" * len(header))
    for name in names:
        status = await registry.status(name)
        if not status.available:
            print(f"{name:<24} unavailable: {status.reason}")
            continue
        for level in levels:
            records, wall_s, errors = await one_level(registry, name, level, args.requests, params)
            total_tokens = sum(r.output_tokens for r in records)
            print(f"{status.label:<24} {status.info.model_id[:28]:<28} {level:>4} {len(records):>4} {fmt(median([r.output_tokens for r in records]), 0):>6} "
                  f"{fmt(median([r.first_token_s * 1000 for r in records if r.first_token_s])):>9} "
                  f"{fmt(median([r.ms_per_output_token for r in records if r.ms_per_output_token]), 2):>9} "
                  f"{fmt(median([r.decode_tokens_per_s for r in records if r.decode_tokens_per_s])):>10} "
                  f"{fmt(total_tokens / wall_s if wall_s else None):>12}")
            for error in errors[:3]:
                print(f"    error: {error}")
    await registry.aclose()


if __name__ == "__main__":
    asyncio.run(main())
