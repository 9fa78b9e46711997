"""Every benchmark goal gets a verdict: met or missed, printed, and the exit status says it.

A benchmark that prints a miss and exits 0 is a report, not a check. Each
script under `bench/` that states a goal builds one `Goal` per claim
(measured value, bounds, unit) and ends with `exit_status(goals)`: every goal
is printed as met or MISSED, and the status is 1 when any goal was missed or
could not be measured (a figure of None never passes).

    goals = [at_most("TTFT bias, vllm (median)", 3.2, 15, unit="ms"),
             within_ratio("decode rate, vllm (worst)", 1.013, 0.02)]
    sys.exit(exit_status(goals))
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable, TextIO

MET, MISSED = 0, 1


@dataclass(frozen=True)
class Goal:
    """One stated goal and what was measured against it.

    `measured` must lie within [`low`, `high`] (either bound may be open).
    None means it could not be measured, which is a miss with `why_unmeasured`.
    """

    name: str
    measured: float | None
    low: float | None = None
    high: float | None = None
    unit: str = ""
    digits: int = 1
    why_unmeasured: str = "not measured"
    stated: str | None = None  # the goal in words, where the bounds alone read badly ("all 64")

    def __post_init__(self) -> None:
        if self.low is None and self.high is None:
            raise ValueError(f"goal {self.name!r} has no bound")

    @property
    def met(self) -> bool:
        if self.measured is None:
            return False
        return (self.low is None or self.measured >= self.low) and (self.high is None or self.measured <= self.high)

    def _number(self, value: float, unit: bool = True) -> str:
        shown = f"{value:.{self.digits}f}"
        return f"{shown} {self.unit}" if unit and self.unit else shown

    @property
    def bounds(self) -> str:
        """'<= 15.0 ms', '>= 0.95', '0.98..1.02'."""
        if self.stated:
            return self.stated
        if self.low is not None and self.high is not None:
            return f"{self._number(self.low, unit=False)}..{self._number(self.high)}"
        if self.high is not None:
            return f"<= {self._number(self.high)}"
        return f">= {self._number(self.low)}"

    def describe(self) -> str:
        """'TTFT bias, vllm (median): 3.2 ms, goal <= 15.0 ms: met'."""
        shown = self.why_unmeasured if self.measured is None else self._number(self.measured)
        return f"{self.name}: {shown}, goal {self.bounds}: {'met' if self.met else 'MISSED'}"


def at_most(name: str, measured: float | None, bound: float, *, unit: str = "", digits: int = 1,
            why_unmeasured: str = "not measured") -> Goal:
    """A goal that `measured` stays at or below `bound`."""
    return Goal(name, measured, high=bound, unit=unit, digits=digits, why_unmeasured=why_unmeasured)


def at_least(name: str, measured: float | None, bound: float, *, unit: str = "", digits: int = 1,
             why_unmeasured: str = "not measured") -> Goal:
    """A goal that `measured` reaches at least `bound`."""
    return Goal(name, measured, low=bound, unit=unit, digits=digits, why_unmeasured=why_unmeasured)


def within_ratio(name: str, ratio: float | None, tolerance: float, *, digits: int = 3,
                 why_unmeasured: str = "not measured") -> Goal:
    """A goal that a ratio lies within 1 +- `tolerance` (e.g. 0.05 for "within 5 %")."""
    return Goal(name, ratio, low=1 - tolerance, high=1 + tolerance, digits=digits, why_unmeasured=why_unmeasured)


def all_of(name: str, count: int | None, total: int) -> Goal:
    """A goal that every one of `total` things passed (e.g. exact token counts): `count` must equal it.
    Nothing to count (`total` 0) is a miss, never a vacuous pass."""
    return Goal(name, count if total else None, low=total, high=total, digits=0, stated=f"all {total}",
                why_unmeasured="nothing to count" if total == 0 else "not measured")


def missed(goals: Iterable[Goal]) -> list[Goal]:
    """The goals not met (including those that could not be measured)."""
    return [goal for goal in goals if not goal.met]


def exit_status(goals: Iterable[Goal], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print every goal's verdict, each missed one again on stderr; 0 when all were met, else 1.

    No goal at all is a miss too: a benchmark that measured nothing has not met anything.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    goals = list(goals)
    print("\nverdict:", file=out)
    for goal in goals:
        print(f"  {goal.describe()}", file=out)
    failed = missed(goals)
    if not goals:
        print("MISSED: nothing was measured, so no goal could be checked", file=err)
        return MISSED
    for goal in failed:
        print(f"MISSED: {goal.describe()}", file=err)
    if not failed:
        print(f"All {len(goals)} goals met.", file=out)
    return MISSED if failed else MET
