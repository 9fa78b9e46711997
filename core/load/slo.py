"""A service-level objective, and which replies meet it (vLLM's goodput definition).

`vllm bench serve --goodput ttft:500 tpot:50 e2el:3000` counts a completed
request as good when each named figure is at or below its bound (in ms):
TTFT; TPOT = (E2EL - TTFT) / (output tokens - 1), 0 for a one-token reply; E2EL.
`request_goodput` is good requests / the level's duration. Here a failed reply
never meets the objective, and the share of replies meeting it is reported over
every reply sent (what a person feels), beside vLLM's goodput.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.timing import RequestRecord

NAMES = ("ttft_ms", "tpot_ms", "e2el_ms")
DEFAULT_SLO = "ttft_ms=500,tpot_ms=50"  # TTFT under 500 ms and at least 20 tokens/s each
DEFAULT_PERCENTILE = 90.0


class SloError(ValueError):
    """An objective that cannot be read; the message says how to write one."""


@dataclass(frozen=True)
class Slo:
    """Bounds in milliseconds (None: not part of the objective) and the share of replies that must meet them."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: float = 90.0

    def __post_init__(self) -> None:
        if not any(getattr(self, name) is not None for name in NAMES):
            raise SloError("an objective needs at least one of ttft_ms, tpot_ms, e2el_ms")
        for name in NAMES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SloError(f"{name} must be above 0 ms (got {value:g})")
        if not 0 < self.percentile <= 100:
            raise SloError(f"the percentile must be in 0..100 (got {self.percentile:g})")

    @property
    def min_tokens_per_s(self) -> float | None:
        """The decode rate a TPOT bound promises each person (1000 / tpot_ms)."""
        return None if self.tpot_ms is None else 1000.0 / self.tpot_ms

    def as_vllm_goodput(self) -> list[str]:
        """The same objective as `vllm bench serve --goodput` arguments, e.g. ['ttft:500', 'tpot:50']."""
        return [f"{name[:-3]}:{getattr(self, name):g}" for name in NAMES if getattr(self, name) is not None]

    def as_dict(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in (*NAMES, "percentile")}


_PART = re.compile(r"^\s*(ttft|tpot|e2el)(?:_ms)?\s*[=:]\s*([0-9]+(?:\.[0-9]*)?)\s*$")


def parse_slo(text: str, percentile: float = 90.0) -> Slo:
    """'ttft_ms=500,tpot_ms=50' (ours) or 'ttft:500 tpot:50' (vLLM's --goodput) -> an Slo."""
    parts = [part for part in re.split(r"[,\s]+", text.strip()) if part]
    if not parts:
        raise SloError("give an objective like ttft_ms=500,tpot_ms=50")
    values: dict[str, float] = {}
    for part in parts:
        match = _PART.match(part)
        if not match:
            raise SloError(f"{part!r}: write each bound as ttft_ms=500, tpot_ms=50 or e2el_ms=3000 (milliseconds)")
        name = f"{match.group(1)}_ms"
        if name in values:
            raise SloError(f"{name} is given twice")
        values[name] = float(match.group(2))
    return Slo(**values, percentile=percentile)


def request_tpot_ms(record: RequestRecord) -> float | None:
    """vLLM's per-request TPOT for goodput: 0 for a one-token reply, None when there was no token."""
    if record.first_token_s is None or record.last_chunk_s is None:
        return None
    if record.output_tokens <= 1:
        return 0.0
    return (record.last_chunk_s - record.first_token_s) / (record.output_tokens - 1) * 1000.0


def within(slo: Slo, *, ttft_ms: float | None, tpot_ms: float | None, e2el_ms: float | None) -> bool:
    """True when each figure the objective names is known and within its bound."""
    figures = {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2el_ms": e2el_ms}
    for name in NAMES:
        bound = getattr(slo, name)
        if bound is not None and (figures[name] is None or figures[name] > bound):
            return False
    return True


def meets(record: RequestRecord | None, slo: Slo) -> bool:
    """True when the reply completed and each of the objective's figures is within its bound."""
    if record is None or record.status != "completed" or record.first_token_s is None:
        return False
    return within(slo, ttft_ms=record.first_token_s * 1000.0, tpot_ms=request_tpot_ms(record),
                  e2el_ms=None if record.last_chunk_s is None else record.last_chunk_s * 1000.0)
