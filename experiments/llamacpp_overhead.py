"""What the app's path costs on the embedded model, against a bare llama-cpp-python loop.

Both paths use the same loaded `Llama` object, the same prompt and the same
number of new tokens, greedy (temperature 0, fixed seed), interleaved run by
run (the order alternates, so drift in machine load hits both alike):

- app path: `LlamaCppBackend.prepare()` + `stream()` measured by `core.streaming.measure`, exactly
  what the chat UI consumes (worker thread, asyncio queue, per-token chunks);
- bare loop: `Llama.create_chat_completion(stream=True)` iterated directly.

Before every run the model's prompt cache is cleared (`Llama.reset()`), so each
TTFT includes the full prompt evaluation. Figures follow core/timing.py's
definitions: TTFT = first non-empty text; decode tokens/s = (tokens - 1) /
(last token time - first token time).

Goals, each with a verdict (exit 1 naming a miss): app decode tokens/s >= 0.95 of
the bare loop's, TTFT within +15 ms of it, the same greedy text every run.

Run: `.venv/bin/python -m experiments.llamacpp_overhead [--runs 5] [--max-tokens 128]`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass

from backends.base import ChatMessage, GenerationParams
from backends.llamacpp import KIND, LlamaCppBackend
from backends.registry import backend_configs
from bench.verdict import Goal, all_of, at_least, at_most, exit_status
from config import BackendConfig, load_env
from core.streaming import measure

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
SEED = 1234
DECODE_RATIO_GOAL = 0.95  # app path decode tokens/s >= 95 % of the bare loop's
TTFT_OVERHEAD_GOAL_MS = 15.0  # the app path's TTFT within +15 ms of the bare loop's (the benchmarks' goal)


def overhead_goals(app: list["Run"], bare: list["Run"]) -> list[Goal]:
    """The app path's goals against the bare loop, on the medians of interleaved runs."""
    ratio = ttft_overhead_ms = None
    if app and bare:
        ratio = statistics.median(r.decode_tokens_per_s for r in app) / statistics.median(
            r.decode_tokens_per_s for r in bare)
        ttft_overhead_ms = (statistics.median(r.first_token_s for r in app)
                            - statistics.median(r.first_token_s for r in bare)) * 1000
    runs = app + bare
    same_text = sum(1 for r in runs if r.text == runs[0].text) if runs else None
    return [
        at_least("decode tokens/s, app path / bare loop (medians)", ratio, DECODE_RATIO_GOAL, digits=3),
        at_most("TTFT, app path - bare loop (medians)", ttft_overhead_ms, TTFT_OVERHEAD_GOAL_MS, unit="ms"),
        all_of("runs whose greedy text equals the first run's", same_text, len(runs)),
    ]


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    path: str
    first_token_s: float
    decode_tokens_per_s: float
    output_tokens: int
    text: str


def embedded_config() -> BackendConfig:
    """The first configured llama.cpp backend (.env / environment), else the bundled default."""
    load_env()
    env = dict(os.environ)
    for config in backend_configs(env):
        if config.kind == KIND.name:
            return config
    return backend_configs({**env, "BACKENDS": "llama_cpp"})[0]


async def app_path_run(backend: LlamaCppBackend, messages: list[ChatMessage], params: GenerationParams) -> Run:
    backend.model.llama.reset()
    text, record = await measure(backend, messages, params)
    return Run("app", record.first_token_s, record.decode_tokens_per_s, record.output_tokens, text)


def bare_run(llama, messages: list[ChatMessage], params: GenerationParams) -> Run:
    """llama-cpp-python's own streaming loop: one chunk per token, timed the same way."""
    llama.reset()
    started = time.perf_counter()
    first_token_at = last_token_at = None
    tokens = 0
    parts: list[str] = []
    stream = llama.create_chat_completion(
        messages=[m.as_dict() for m in messages], stream=True, max_tokens=params.max_new_tokens,
        temperature=params.temperature, top_p=params.top_p, seed=params.seed,
    )
    for chunk in stream:
        text = chunk["choices"][0]["delta"].get("content") or ""
        if not text:
            continue
        now = time.perf_counter()
        if first_token_at is None:
            first_token_at = now
        last_token_at = now
        tokens += 1
        parts.append(text)
    rate = (tokens - 1) / (last_token_at - first_token_at) if tokens >= 2 else float("nan")
    return Run("bare", first_token_at - started, rate, tokens, "".join(parts))


async def main_async(runs: int, max_tokens: int) -> int:
    config = embedded_config()
    backend = LlamaCppBackend(config)
    load_started = time.perf_counter()
    await backend.ensure_loaded()
    llama = backend.model.llama
    print(f"model: {backend.model.path.name}  threads: {backend.model.n_threads}  "
          f"loaded in {time.perf_counter() - load_started:.2f} s")
    messages = [ChatMessage("user", PROMPT)]
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=max_tokens, seed=SEED)
    prompt_tokens = len(backend.model.prompt_tokens(messages))
    print(f"prompt: {prompt_tokens} tokens; up to {max_tokens} new tokens; greedy; {runs} runs per path, interleaved")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    # Warm-up (not counted): first-touch page faults, thread pool start.
    await app_path_run(backend, messages, params)
    bare_run(llama, messages, params)

    results: list[Run] = []
    print(f"\n{'run':>3}  {'path':<4}  {'TTFT ms':>8}  {'decode tok/s':>12}  {'tokens':>6}")
    for index in range(runs):
        order = ("app", "bare") if index % 2 == 0 else ("bare", "app")
        for path in order:
            if path == "app":
                run = await app_path_run(backend, messages, params)
            else:
                run = bare_run(llama, messages, params)
            results.append(run)
            print(f"{index + 1:>3}  {run.path:<4}  {run.first_token_s * 1000:>8.1f}  "
                  f"{run.decode_tokens_per_s:>12.2f}  {run.output_tokens:>6}")

    app = [r for r in results if r.path == "app"]
    bare = [r for r in results if r.path == "bare"]
    app_rate = statistics.median(r.decode_tokens_per_s for r in app)
    bare_rate = statistics.median(r.decode_tokens_per_s for r in bare)
    app_ttft_ms = statistics.median(r.first_token_s for r in app) * 1000
    bare_ttft_ms = statistics.median(r.first_token_s for r in bare) * 1000
    same_text = len({r.text for r in results}) == 1
    ratio = app_rate / bare_rate
    print("\nmedians")
    print(f"  decode tokens/s   app {app_rate:.2f}   bare {bare_rate:.2f}   ratio {ratio:.3f}")
    print(f"  TTFT ms           app {app_ttft_ms:.1f}   bare {bare_ttft_ms:.1f}   "
          f"overhead {app_ttft_ms - bare_ttft_ms:+.1f} ms")
    print(f"  same output text in every run: {'yes' if same_text else 'NO'}; "
          f"tokens app {app[0].output_tokens}, bare {bare[0].output_tokens}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return exit_status(overhead_goals(app, bare))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per path")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args.runs, args.max_tokens))


if __name__ == "__main__":
    sys.exit(main())
