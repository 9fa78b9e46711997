"""How long the leaderboard takes to compute for a class's worth of votes.

Makes `--votes` synthetic blind votes on 4 backends (2-3 columns, replies with markdown and
varied speed, reveal "pace", so every covariate is fitted), then times, as the chat does it:
turning the stored votes into battles (markdown counted in every reply), and the whole board
(plain ratings with 1,000 bootstrap samples, controlled ratings with speed, length and style and
`--controlled-samples` samples). Reading the votes from the database is not included.

Goal: well under a second at 2,000 votes, since the leaderboard is a chat message. Each line
gives the wall time and this process's CPU time: on a busy machine the wall time includes
waiting for a core, the CPU time is what the work itself costs (one core: the fit runs on the
calling thread, see compare.one_blas_thread).

Run: `.venv/bin/python -m experiments.leaderboard_fit [--votes 2000] [--controlled-samples 500,1000,200] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from datetime import datetime, timedelta, timezone

from core.ratings import one_blas_thread

one_blas_thread()  # as the app and `python -m core.ratings` run the fit

from core.ratings.battles import PromptCatalogue, battles_from_votes  # noqa: E402
from core.ratings.board import build_board  # noqa: E402
from store import ColumnReply, RoundColumn, Vote, VoteRecord  # noqa: E402

SPEEDS = {"vllm": 60.0, "tgi": 45.0, "llama_cpp": 20.0, "openai": 30.0}
REPLIES = ("Plain answer without markdown. " * 8,
           "## Answer\n\n- **first** point\n- second point\n\n1. step\n2. step\n" * 2,
           "Short.",
           "# Title\nSome **bold** text and __more__.\n" * 3)


def synthetic_votes(count: int, seed: int) -> list[VoteRecord]:
    rng = random.Random(seed)
    t0 = datetime(2025, 3, 1, tzinfo=timezone.utc)
    records = []
    for number in range(count):
        names = rng.sample(sorted(SPEEDS), rng.choice((2, 2, 3)))
        columns = tuple(RoundColumn(label, name, f"{number}-{label}") for label, name in zip("ABC", names))
        replies = tuple(ColumnReply(
            backend_label=name, model="m", reply_text=rng.choice(REPLIES), status="completed",
            first_token_s=0.3 * rng.lognormvariate(0, 0.5), decode_tokens_per_s=SPEEDS[name] * rng.lognormvariate(0, 0.6),
            output_tokens=rng.randint(20, 400), total_s=3.0, settings_sent={"temperature": 0.7}) for name in names)
        outcome = rng.choice(("win", "win", "win", "tie", "both_bad"))
        vote = Vote(round_id=f"round-{number}", outcome=outcome,
                    winner_label=rng.choice("ABC"[:len(names)]) if outcome == "win" else None,
                    user_identifier=f"student-{number % 30}", created_at=t0 + timedelta(minutes=number))
        records.append(VoteRecord(vote=vote, mode="blind", columns=columns, prompt=f"question {number % 50}",
                                  reveal="pace", replies=replies))
    return records


def timed(work, repeats: int) -> tuple[object, list[float], list[float]]:
    """Run `work` `repeats` times: its last result, and the wall and CPU seconds of each run."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, walls, cpus


def milliseconds(walls: list[float], cpus: list[float]) -> str:
    return (f"wall median {statistics.median(walls) * 1000:.0f} ms (max {max(walls) * 1000:.0f}), "
            f"CPU median {statistics.median(cpus) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--votes", type=int, default=2000)
    parser.add_argument("--controlled-samples", default="500,1000,200")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    records = synthetic_votes(args.votes, seed=1)
    battles, walls, cpus = timed(lambda: battles_from_votes(records, PromptCatalogue()), args.repeats)
    print(f"{args.votes} votes -> {len(battles)} battles; load average {os.getloadavg()[0]:.1f}")
    print(f"battles from stored votes: {milliseconds(walls, cpus)}")
    for samples in (int(value) for value in args.controlled_samples.split(",")):
        board, walls, cpus = timed(lambda: build_board(battles, controlled_bootstrap_samples=samples), args.repeats)
        effects = sum(effect.win_share is not None for effect in board.controlled.effects)
        print(f"board (plain 1000 + controlled {samples} samples, {effects} effects fitted): {milliseconds(walls, cpus)}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
