"""A progress bar that fits where it is shown.

In a terminal the bar redraws in place as often as tqdm likes. In a log (CI,
a pipe, a file) every redraw would be written out: tqdm writes a new
carriage-return line per refresh, tens of KB in a two-minute run. There the
bar is redrawn at most every `LOG_INTERVAL_S` seconds, at a fixed width, in
ASCII, so a log holds a readable line every few seconds and the final count.
"""

from __future__ import annotations

import sys
from typing import TextIO

LOG_INTERVAL_S = 10.0
LOG_WIDTH = 100


def bar_options(stream: TextIO | None = None) -> dict:
    """tqdm keyword arguments for `stream` (default stderr): live in a terminal, sparse in a log."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return {"file": stream, "dynamic_ncols": True}
    return {"file": stream, "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S * 3,
            "ncols": LOG_WIDTH, "ascii": True}


def progress_bar(total: int, unit: str = "req", stream: TextIO | None = None):
    """A tqdm bar of `total` steps suited to `stream` (see `bar_options`)."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, **bar_options(stream))


def request_progress(bar):
    """The load engine's per-request callback, `(stage, outcome)`, that moves `bar` on by one,
    shows the stage and counts failed requests beside it."""
    failures = 0

    def progress(stage: str, outcome) -> None:
        nonlocal failures
        failures += 0 if outcome is None or outcome.ok else 1
        bar.set_description(stage)
        bar.set_postfix(failed=failures)
        bar.update(1)

    return progress
