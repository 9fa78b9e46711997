"""Aggregate tokens/s through the app vs straight to vLLM, in one run (goal: app / direct >= 0.9).

Against one real vLLM server, with the same prompts and the same sampling
(greedy, the same max new tokens, no system prompt), two paths take turns:

- **app**: N chat sessions on the running app (`chainlit run app.py`), each a
  simulated browser tab speaking Chainlit's socket.io protocol
  (`load.chainlit_client.AsyncChainlitClient`), sending its prompts one after
  another. Each prompt goes to a new chat, opened before the phase's clock
  starts, so every request carries exactly the messages the direct path sends
  (a chat that goes on would send its history too). Tokens are what the app
  measured and stored (its database's replies), checked against the change in
  vLLM's own `vllm:generation_tokens_total`.
- **direct**: the same prompts at concurrency N through the bench's load
  engine (`core.load.runner.run_level`), the same OpenAI-protocol backend class
  the app uses, checked against the same counter.

Phases alternate direct, app, app, direct, ... (ABBA, so drift on a noisy
machine falls on both paths), after a warm-up that sends every prompt once.
A phase's tokens/s = its output tokens / its wall time (first message sent
to last reply complete); pooled = all tokens of a path / all its wall time.
TTFT p50: per path on the app's own clock (the request leaving to its first
text, `core/timing.py`); for the app also as the tab sees it (message sent to the
first text over the socket). Where the time goes, per phase: requests in
flight at vLLM on average (how full its batch was kept; for the app also
the tabs waiting for a reply), the app's time per reply outside the vLLM
request (before it leaves and after its stream ends), and the CPU seconds
of vLLM, the app and this process (whose simulated tabs stand in for
browsers that would run elsewhere).

Without --vllm-url it starts vLLM (~1 min) and the app on free loopback
ports and stops both by PID at the end or on Ctrl-C (which writes what was
measured so far and exits 130). Exit status 1 when it could not measure
(a server did not start, a request failed, nothing was generated) or a goal
was missed: the ratio app / direct below --goal-ratio (0.9), or a phase whose
token count differs from vLLM's counter; each miss is named.

Run: `.venv/bin/python -m experiments.app_vs_direct [--sessions 8] [--prompts-per-session 6] [--max-new-tokens 128]
      [--rounds 2] [--prompts en] [--vllm-url http://127.0.0.1:8001/v1] [--out DIR]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import urlparse

import psutil

from backends.base import GenerationParams
from backends.errors import BackendError
from backends.openai_compat import OpenAICompatBackend
from bench.verdict import Goal, all_of, at_least, exit_status as verdict_status
from config import REPO, BackendConfig
from core.concurrency import run_together
from core.load.engine_memory import listening_pid, process_tree
from core.load.prompt_sets import BenchPrompt, PromptSetError, cycle, load_prompt_set, prompt_text
from core.load.runner import run_level
from core.timing import percentile
from load.chainlit_client import AsyncChainlitClient, ChatFailed, ReplyRecord
from servers.app import APP_START_TIMEOUT_S, chainlit_command
from servers.process import ServerProcess, free_port
from store import Store

GOAL = 0.9
BACKEND_NAME = "vllm"
REPLY_TIMEOUT_S = 300.0
OPEN_TIMEOUT_S = 60.0
VLLM_START_TIMEOUT_S = 600.0
PATHS = ("direct", "app")


def phase_order(rounds: int) -> list[str]:
    """direct, app, app, direct, direct, app, ... (ABBA): each path gets the same share of early and late slots."""
    order: list[str] = []
    for round_index in range(rounds):
        order += list(PATHS if round_index % 2 == 0 else reversed(PATHS))
    return order


def in_flight(durations_s: Sequence[float], wall_s: float) -> float | None:
    """Mean number of things in progress over `wall_s`, from their durations."""
    return round(sum(durations_s) / wall_s, 2) if wall_s > 0 and durations_s else None


def p50(values: Sequence[float]) -> float | None:
    return percentile(list(values), 50) if values else None


def ms(values_s: Sequence[float | None]) -> list[float]:
    return [round(value * 1000, 1) for value in values_s if value is not None]


@dataclass
class Phase:
    """One timed pass of every prompt along one path."""

    number: int
    path: str  # "direct" | "app"
    requests: int
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    output_tokens: int = 0  # the path's own count: the runner's records, or the app's stored replies
    vllm_generation_tokens: int | None = None  # change in vllm:generation_tokens_total over the phase
    ttft_ms: list[float] = field(default_factory=list)  # request leaving -> first text, core/timing.py (app: stored)
    tab_ttft_ms: list[float] = field(default_factory=list)  # app only: message sent -> first text over the socket
    # Sum of the requests' durations (leaving -> stream closed) / wall: how full vLLM's batch was kept.
    mean_requests_in_flight: float | None = None
    # App only: sum of (message sent -> reply complete) / wall; the rest of the tabs' time is between replies.
    mean_tabs_waiting: float | None = None
    # App only: per reply, the tab's wait minus the request's time at vLLM (the app's work around a request).
    app_ms_per_reply_outside_request: float | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # process trees: vllm, app, bench
    interrupted: bool = False

    @property
    def failed(self) -> int:
        return self.requests - self.completed

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def ttft_p50_ms(self) -> float | None:
        return p50(self.ttft_ms)

    @property
    def tab_ttft_p50_ms(self) -> float | None:
        return p50(self.tab_ttft_ms)

    @property
    def counts_agree(self) -> bool:
        return self.vllm_generation_tokens == self.output_tokens

    def as_dict(self) -> dict:
        return {**asdict(self), "failed": self.failed, "tokens_per_s": self.tokens_per_s,
                "ttft_p50_ms": self.ttft_p50_ms, "tab_ttft_p50_ms": self.tab_ttft_p50_ms,
                "counts_agree": self.counts_agree}


# ---------------------------------------------------------------- what the machine is doing


class CpuMeter:
    """CPU seconds (user + system) used by named process trees since `start()`."""

    def __init__(self, roots: dict[str, int | None], without_children: set[str] = frozenset()) -> None:
        self.roots = {name: pid for name, pid in roots.items() if pid is not None}
        self.without_children = without_children
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        totals = {}
        for name, pid in self.roots.items():
            total = 0.0
            try:
                processes = [psutil.Process(pid)] if name in self.without_children else process_tree(pid)
            except psutil.NoSuchProcess:
                continue
            for process in processes:
                try:
                    times = process.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += times.user + times.system
            totals[name] = total
        return totals

    def start(self) -> None:
        self._start = self._read()

    def used(self) -> dict[str, float]:
        now = self._read()
        return {name: round(now[name] - self._start.get(name, now[name]), 2) for name in now}


def port_pid(url: str) -> int | None:
    port = urlparse(url).port
    try:
        return listening_pid(port) if port else None
    except psutil.AccessDenied:
        return None


async def generation_tokens(backend: OpenAICompatBackend) -> int | None:
    """vLLM's own count of generated tokens so far (its /metrics, through the app's parser)."""
    snapshot = await backend.engine_snapshot()
    value = snapshot.generation_tokens_total if snapshot else None
    return None if value is None else int(value)


# ---------------------------------------------------------------- the two paths


async def direct_phase(phase: Phase, backend: OpenAICompatBackend, prompts: Sequence[BenchPrompt], sessions: int,
                       params: GenerationParams, model: str, cpu: CpuMeter, tick: Callable[[], None]) -> Phase:
    before = await generation_tokens(backend)
    cpu.start()
    level = await run_level(backend, prompts, concurrency=sessions, requests=len(prompts), params=params,
                            model=model, on_done=lambda outcome: tick())
    phase.cpu_s = cpu.used()
    phase.wall_s = level.duration_s
    done = [outcome.record for outcome in level.outcomes if outcome.ok]
    phase.completed = len(done)
    phase.errors = [outcome.error or "stopped" for outcome in level.outcomes if not outcome.ok]
    phase.output_tokens = sum(record.output_tokens for record in done)
    phase.ttft_ms = ms([record.first_token_s for record in done])
    phase.mean_requests_in_flight = in_flight([record.total_s for record in done], phase.wall_s)
    after = await generation_tokens(backend)
    phase.vllm_generation_tokens = None if None in (before, after) else after - before
    if level.interrupted:
        raise asyncio.CancelledError
    return phase


async def open_chats(app_url: str, count: int, sessions: int) -> list[AsyncChainlitClient]:
    """`count` new chats, at most `sessions` opening at once (as many tabs pressing "New chat")."""
    gate = asyncio.Semaphore(sessions)
    clients = [AsyncChainlitClient(app_url) for _ in range(count)]

    async def open_one(client: AsyncChainlitClient) -> None:
        async with gate:
            await client.open_chat(OPEN_TIMEOUT_S)

    try:
        await asyncio.gather(*(open_one(client) for client in clients))
    except BaseException:
        await close_chats(clients)
        raise
    return clients


async def close_chats(clients: Sequence[AsyncChainlitClient]) -> None:
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def stored_reply_ids(store: Store) -> set[str]:
    return {reply.id for reply in await store.replies(limit=1_000_000, backend=BACKEND_NAME)}


async def app_phase(phase: Phase, app_url: str, store: Store, backend: OpenAICompatBackend,
                    prompts: Sequence[BenchPrompt], sessions: int, cpu: CpuMeter, tick: Callable[[], None]) -> Phase:
    # Each tab takes the next prompt when its reply is complete, as `run_level` hands them out.
    queue = deque(enumerate(prompts))
    chats = await open_chats(app_url, len(prompts), sessions)  # one per prompt, before the clock
    records: list[ReplyRecord] = []
    try:
        seen = await stored_reply_ids(store)
        before = await generation_tokens(backend)
        cpu.start()

        async def tab() -> None:
            while queue:
                index, prompt = queue.popleft()
                records.append(await chats[index].ask(prompt_text(prompt), REPLY_TIMEOUT_S))
                tick()

        started = time.perf_counter()
        await run_together(tab() for _ in range(sessions))
        phase.wall_s = time.perf_counter() - started
        phase.cpu_s = cpu.used()
        after = await generation_tokens(backend)
    finally:
        await close_chats(chats)
    replies = [reply for reply in await store.replies(limit=1_000_000, backend=BACKEND_NAME) if reply.id not in seen]
    completed = [reply for reply in replies if reply.status == "completed"]
    phase.completed = min(len(completed), sum(1 for record in records if record.ok))
    phase.errors = [f"{record.outcome}: {(record.error or '')[:200]}" for record in records if not record.ok]
    phase.errors += [f"stored reply {reply.status}: {reply.error}" for reply in replies if reply.status != "completed"]
    phase.output_tokens = sum(reply.output_tokens for reply in replies)
    phase.ttft_ms = ms([reply.first_token_s for reply in completed])
    phase.tab_ttft_ms = ms([record.first_token_s for record in records])
    phase.vllm_generation_tokens = None if None in (before, after) else after - before
    phase.mean_requests_in_flight = in_flight([reply.total_s for reply in replies], phase.wall_s)
    tab_waits_s = [record.reply_s for record in records if record.reply_s]
    phase.mean_tabs_waiting = in_flight(tab_waits_s, phase.wall_s)
    if replies and len(tab_waits_s) == len(replies):
        outside_s = sum(tab_waits_s) - sum(reply.total_s for reply in replies)
        phase.app_ms_per_reply_outside_request = round(outside_s / len(replies) * 1000, 1)
    return phase


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    settings: dict
    goal_ratio: float = GOAL
    phases: list[Phase] = field(default_factory=list)
    interrupted: bool = False
    problem: str | None = None  # why it could not measure
    load_average: dict[str, list[float]] = field(default_factory=dict)

    def pooled(self, path: str) -> dict:
        phases = [phase for phase in self.phases if phase.path == path and not phase.interrupted]
        tokens = sum(phase.output_tokens for phase in phases)
        wall_s = sum(phase.wall_s for phase in phases)
        return {"phases": len(phases), "output_tokens": tokens, "wall_s": wall_s,
                "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
                "ttft_p50_ms": p50([value for phase in phases for value in phase.ttft_ms]),
                "tab_ttft_p50_ms": p50([value for phase in phases for value in phase.tab_ttft_ms])}

    @property
    def ratio(self) -> float | None:
        app, direct = self.pooled("app")["tokens_per_s"], self.pooled("direct")["tokens_per_s"]
        return app / direct if app and direct else None

    def as_dict(self) -> dict:
        ratio = self.ratio
        return {"settings": self.settings, "phases": [phase.as_dict() for phase in self.phases],
                "pooled": {path: self.pooled(path) for path in PATHS}, "ratio_app_over_direct": ratio,
                "goal": self.goal_ratio, "goal_met": None if ratio is None else ratio >= self.goal_ratio,
                "counts_agree": all(phase.counts_agree for phase in self.phases),
                "interrupted": self.interrupted, "problem": self.problem, "load_average": self.load_average}


async def measure(run: Run, vllm_url: str, app_url: str, database_url: str, prompts: list[BenchPrompt],
                  sessions: int, params: GenerationParams, rounds: int) -> None:
    from bench.progress import progress_bar

    backend = OpenAICompatBackend(BackendConfig(name=BACKEND_NAME, kind="vllm", label="vLLM", base_url=vllm_url))
    store = await Store.open(database_url)
    order = phase_order(rounds)
    unique = list({prompt.source: prompt for prompt in prompts}.values())
    bar = progress_bar(len(unique) + 1 + len(order) * len(prompts))
    cpu = CpuMeter({"vllm": port_pid(vllm_url), "app": port_pid(app_url), "bench": os.getpid()},
                   without_children={"bench"})  # the servers may be this process's children
    try:
        model = await backend.model_id()
        await backend.warm_up()
        # Warm-up: every prompt once straight to vLLM (a path measured first must not pay for a cold
        # prefix cache alone), then one reply through the app (its first request imports and connects).
        bar.set_description("warm-up")
        await run_level(backend, unique, concurrency=sessions, requests=len(unique),
                        params=GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=1), model=model,
                        on_done=lambda outcome: bar.update(1))
        chats = await open_chats(app_url, 1, 1)
        try:
            warm = await chats[0].ask(prompt_text(prompts[0]), REPLY_TIMEOUT_S)
        finally:
            await close_chats(chats)
        bar.update(1)
        if not warm.ok:
            run.problem = f"the app's warm-up reply failed ({warm.outcome}): {warm.error or warm.text[:200]}"
            return
        for number, path in enumerate(order, start=1):
            bar.set_description(f"phase {number}/{len(order)}: {path}")
            phase = Phase(number, path, len(prompts))
            run.phases.append(phase)
            try:
                if path == "direct":
                    await direct_phase(phase, backend, prompts, sessions, params, model, cpu, lambda: bar.update(1))
                else:
                    await app_phase(phase, app_url, store, backend, prompts, sessions, cpu, lambda: bar.update(1))
            except asyncio.CancelledError:
                phase.interrupted = True  # not pooled: its wall time and tokens are partial
                raise
            bar.set_postfix(tokens_per_s=f"{phase.tokens_per_s or 0:.1f}")
    except asyncio.CancelledError:
        run.interrupted = True
    except ChatFailed as error:
        run.problem = f"a chat could not be opened on the app: {error}"
    except BackendError as error:  # vLLM down or failing outside a request (requests record their own)
        run.problem = error.describe()
    finally:
        bar.close()
        await store.aclose()
        await backend.aclose()


# ---------------------------------------------------------------- output


def _n(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def results_table(run: Run) -> str:
    """The per-phase and pooled figures as a markdown table, then the verdict."""
    lines = ["| phase | path | requests ok | wall s | output tokens | vLLM counter Δ | tokens/s | "
             "TTFT p50 ms (app's clock) | TTFT p50 ms (tab) | in flight at vLLM (tabs waiting) | "
             "app ms per reply outside the request | CPU s vLLM / app / bench |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for phase in run.phases:
        cpu = " / ".join(_n(phase.cpu_s.get(name)) for name in ("vllm", "app", "bench"))
        lines.append(f"| {phase.number}{' (interrupted)' if phase.interrupted else ''} | {phase.path} | "
                     f"{phase.completed}/{phase.requests} | {_n(phase.wall_s)} | {phase.output_tokens:,} | "
                     f"{'–' if phase.vllm_generation_tokens is None else f'{phase.vllm_generation_tokens:,}'} | "
                     f"{_n(phase.tokens_per_s)} | {_n(phase.ttft_p50_ms)} | {_n(phase.tab_ttft_p50_ms)} | "
                     f"{_n(phase.mean_requests_in_flight, 2)}"
                     f"{'' if phase.mean_tabs_waiting is None else f' ({phase.mean_tabs_waiting:.2f})'} | "
                     f"{_n(phase.app_ms_per_reply_outside_request, 0)} | {cpu} |")
    for path in PATHS:
        pooled = run.pooled(path)
        lines.append(f"| pooled | {path} | | {_n(pooled['wall_s'])} | {pooled['output_tokens']:,} | | "
                     f"**{_n(pooled['tokens_per_s'])}** | {_n(pooled['ttft_p50_ms'])} | "
                     f"{_n(pooled['tab_ttft_p50_ms'])} | | | |")
    lines.append("")
    lines.append(verdict(run))
    return "\n".join(lines)


def goals(run: Run) -> list[Goal]:
    """The run's goals: pooled tokens/s through the app at least `goal_ratio` of the direct path's,
    every request of every phase completed, and every phase's token count equal to vLLM's counter."""
    measured = [phase for phase in run.phases if not phase.interrupted]
    requests = sum(phase.requests for phase in measured)
    why = run.problem or "no phase of both paths was measured"
    return [
        at_least("output tokens/s, app / direct (pooled)", run.ratio, run.goal_ratio, digits=3, why_unmeasured=why),
        all_of("requests completed", sum(phase.completed for phase in measured), requests),
        all_of("phases whose output tokens equal the change in vLLM's generation_tokens_total",
               sum(1 for phase in measured if phase.counts_agree), len(measured)),
    ]


def verdict(run: Run) -> str:
    """The goals, one line each, for the results file."""
    return "\n".join(f"- {goal.describe()}" for goal in goals(run))


def write_results(run: Run, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    settings = run.settings
    header = (f"# App vs direct to vLLM\n\n{settings['sessions']} concurrent sessions, "
              f"{settings['requests_per_phase']} requests per phase ({settings['prompt_set']} prompts, "
              f"{settings['max_new_tokens']} new tokens, greedy, no system prompt), phases {settings['order']}; "
              f"load average before {settings.get('load_before')} after {run.load_average.get('after')}.\n\n")
    markdown = out / "results.md"
    markdown.write_text(header + results_table(run) + "\n", encoding="utf-8")
    data = out / "results.json"
    data.write_text(json.dumps(run.as_dict(), indent=1), encoding="utf-8")
    return [markdown, data]


def exit_status(run: Run) -> int:
    """130 when interrupted; else the verdict: 0 when every goal was met, 1 naming each miss."""
    if run.interrupted:
        return 130
    return verdict_status(goals(run))


# ---------------------------------------------------------------- servers and main


def app_env(vllm_url: str, max_new_tokens: int, database_url: str) -> dict[str, str]:
    """The app with one backend, vLLM, and the direct path's sampling as every session's default."""
    return {"BACKENDS": BACKEND_NAME, "DEFAULT_BACKEND": BACKEND_NAME, "VLLM_BASE_URL": vllm_url,
            "DEFAULT_TEMPERATURE": "0", "DEFAULT_TOP_P": "1", "DEFAULT_MAX_NEW_TOKENS": str(max_new_tokens),
            "DEFAULT_SYSTEM_PROMPT": "none", "DEFAULT_MODE": "chat", "AUTH_USERS": "",
            "DATABASE_URL": database_url}


def start_server(name: str, command: list[str], env: dict[str, str], ready_url: str, timeout_s: float,
                 started: list[ServerProcess]) -> ServerProcess:
    """Start a server, noted in `started` at once (so Ctrl-C while it boots still stops it), and wait for it."""
    server = ServerProcess(name, command, env=env)
    started.append(server)
    server.start_serving(ready_url, timeout_s)
    return server


def start_vllm(started: list[ServerProcess]) -> str:
    """The bundled model on vLLM (CPU recipe of scripts/vllm_launch.py) on a free port; its /v1 URL."""
    from scripts.convert_gguf_to_hf import is_converted
    from scripts.vllm_launch import (BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, convert_bundled_model,
                                     missing_venv_message, server_command, server_env)

    problem = missing_venv_message()
    if problem:
        raise RuntimeError(problem)
    if not is_converted(BUNDLED_MODEL_DIR):
        convert_bundled_model()
    port = free_port()
    command = server_command(model=BUNDLED_MODEL_DIR, served_model_name=BUNDLED_MODEL_NAME, port=port, cpu=True)
    start_server("app-vs-direct-vllm", command, server_env(cpu=True), f"http://127.0.0.1:{port}/health",
                 VLLM_START_TIMEOUT_S, started)
    return f"http://127.0.0.1:{port}/v1"


def start_the_app(env: dict[str, str], started: list[ServerProcess]) -> str:
    """`chainlit run app.py --headless` on a free loopback port, as the tests start it; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start_server("app-vs-direct-app", chainlit_command(port), {"CHAINLIT_APP_ROOT": str(REPO), **env}, url + "/",
                 APP_START_TIMEOUT_S, started)
    return url


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.app_vs_direct", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sessions", type=int, default=8, help="concurrent chat sessions = direct concurrency (8)")
    parser.add_argument("--prompts-per-session", type=int, default=6, help="per session and phase (6)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="16..4096, the app's bounds (128)")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of phases, ABBA order (2: direct app app direct)")
    parser.add_argument("--prompts", default="en", help="zh, en or a JSONL file (en)")
    parser.add_argument("--vllm-url", help="a running vLLM, http://127.0.0.1:PORT/v1 (default: start one)")
    parser.add_argument("--goal-ratio", type=float, default=GOAL,
                        help=f"the lowest app / direct tokens/s ratio that meets the goal ({GOAL})")
    parser.add_argument("--out", type=Path, help="folder for results.md and results.json "
                                                 "(default bench/results/app-vs-direct-<time>)")
    args = parser.parse_args(argv)
    for name, low, high in (("sessions", 1, 64), ("prompts_per_session", 1, 1000), ("max_new_tokens", 16, 4096),
                            ("rounds", 1, 20)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} must be {low}..{high}")
    if args.vllm_url and urlparse(args.vllm_url).hostname not in ("127.0.0.1", "localhost"):
        parser.error("--vllm-url must be on loopback (127.0.0.1): CPU time is read from its processes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prompts = cycle(load_prompt_set(args.prompts), args.sessions * args.prompts_per_session)
    except PromptSetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or REPO / "bench" / "results" / f"app-vs-direct-{datetime.now():%Y%m%d-%H%M%S}"
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    run = Run(goal_ratio=args.goal_ratio, settings={
               "sessions": args.sessions, "prompts_per_session": args.prompts_per_session,
               "requests_per_phase": len(prompts), "max_new_tokens": args.max_new_tokens,
               "prompt_set": args.prompts, "order": ", ".join(phase_order(args.rounds)),
               "sent": {"temperature": 0.0, "top_p": 1.0, "max_tokens": args.max_new_tokens},
               "vllm_started_here": args.vllm_url is None})
    started: list[ServerProcess] = []
    database_dir = tempfile.mkdtemp(prefix="app-vs-direct-db-")
    database_url = f"sqlite:///{database_dir}/lab.db"
    try:
        vllm_url = args.vllm_url
        if vllm_url is None:
            print("starting vLLM (about a minute on CPU)...", file=sys.stderr, flush=True)
            vllm_url = start_vllm(started)
        print("starting the app...", file=sys.stderr, flush=True)
        app_url = start_the_app(app_env(vllm_url, args.max_new_tokens, database_url), started)
        run.settings |= {"vllm_url": vllm_url, "app_url": app_url,
                         "load_before": [round(x, 2) for x in os.getloadavg()]}
        asyncio.run(measure(run, vllm_url, app_url, database_url, prompts, args.sessions, params, args.rounds))
    except KeyboardInterrupt:
        run.interrupted = True
    except RuntimeError as error:  # a server did not start (ServerProcess says why, with its log)
        run.problem = str(error)
    finally:
        for server in reversed(started):  # the app, then vLLM
            server.stop()
        shutil.rmtree(database_dir, ignore_errors=True)
    run.load_average["after"] = [round(x, 2) for x in os.getloadavg()]
    paths = write_results(run, out)
    print()
    print(results_table(run))
    if run.problem:
        print(f"\ncould not measure: {run.problem}", file=sys.stderr)
    print("Wrote " + ", ".join(str(path) for path in paths))
    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
