"""A level's figures, under `vllm bench serve`'s names where the quantity is the same.

Definitions (vLLM's, and `core/timing.py`'s): TTFT per request; TPOT per request =
(end of generation - TTFT) / (output tokens - 1), over requests with 2+ tokens;
ITL = every gap between token chunks, pooled over all requests; E2EL = end of
generation from the request being sent. Throughputs are over the level's wall
time (`duration`): `output_throughput` = all output tokens / duration,
`request_throughput` = completed requests / duration. Percentiles interpolate
linearly between ranks (numpy's default, as vLLM's). Failed requests count in
`failed` with their errors, never in the figures.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

from core.load.runner import LevelResult, RequestOutcome
from core.timing import percentile



@dataclass(frozen=True)
class Distribution:
    """mean, median, std and p90/p99 of a set of values in ms (None when there are none)."""

    mean: float | None
    median: float | None
    std: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> "Distribution":
        if not values_ms:
            return cls(None, None, None, None, None)
        return cls(
            mean=statistics.fmean(values_ms),
            median=statistics.median(values_ms),
            std=statistics.pstdev(values_ms),  # numpy's std (population), as vLLM reports
            p90=percentile(values_ms, 90),
            p99=percentile(values_ms, 99),
        )


@dataclass(frozen=True)
class LevelSummary:
    """The figures of one backend at one concurrency."""

    backend: str
    label: str
    model: str
    concurrency: int
    completed: int
    failed: int
    duration: float  # s
    total_input_tokens: int
    total_output_tokens: int
    mean_input_tokens: float | None
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s, all requests
    total_token_throughput: float  # (input + output) tokens / s
    mean_output_tokens_per_s_per_request: float | None  # decode rate of one stream, averaged
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    errors: tuple[str, ...]
    interrupted: bool = False

    def vllm_fields(self) -> dict[str, float | int | None]:
        """The summary under the names `vllm bench serve --save-result` uses, plus ours beside them."""
        fields: dict[str, float | int | None] = {
            "backend": self.backend, "label": self.label, "model": self.model,
            "max_concurrency": self.concurrency, "completed": self.completed, "failed": self.failed,
            "duration": self.duration, "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens, "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput, "total_token_throughput": self.total_token_throughput,
            "mean_input_tokens": self.mean_input_tokens,
            "mean_output_tokens_per_s_per_request": self.mean_output_tokens_per_s_per_request,
        }
        for name, distribution in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("itl", self.itl_ms),
                                   ("e2el", self.e2el_ms)):
            fields[f"mean_{name}_ms"] = distribution.mean
            fields[f"median_{name}_ms"] = distribution.median
            fields[f"std_{name}_ms"] = distribution.std
            fields[f"p90_{name}_ms"] = distribution.p90
            fields[f"p99_{name}_ms"] = distribution.p99
        fields["errors"] = list(self.errors)
        fields["interrupted"] = self.interrupted
        return fields


def summarise(level: LevelResult) -> LevelSummary:
    """A level's figures from its requests (the completed ones; failures only counted)."""
    done = [outcome for outcome in level.outcomes if outcome.ok]
    records = [outcome.record for outcome in done]
    output_tokens = sum(record.output_tokens for record in records)
    input_counts = [outcome.input_tokens for outcome in done if outcome.input_tokens is not None]
    input_tokens = sum(input_counts)
    duration = level.duration_s or 1e-9
    itl_ms = [gap * 1000 for record in records for gap in record.chunk_gaps_s]
    rates = [record.decode_tokens_per_s for record in records if record.decode_tokens_per_s]
    return LevelSummary(
        backend=level.backend,
        label=level.label,
        model=level.model,
        concurrency=level.concurrency,
        completed=len(done),
        failed=len(level.outcomes) - len(done),
        duration=level.duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        mean_input_tokens=statistics.fmean(input_counts) if input_counts else None,
        request_throughput=len(done) / duration,
        output_throughput=output_tokens / duration,
        total_token_throughput=(input_tokens + output_tokens) / duration,
        mean_output_tokens_per_s_per_request=statistics.fmean(rates) if rates else None,
        ttft_ms=Distribution.of([r.first_token_s * 1000 for r in records if r.first_token_s is not None]),
        tpot_ms=Distribution.of([r.ms_per_output_token for r in records if r.ms_per_output_token is not None]),
        itl_ms=Distribution.of(itl_ms),
        e2el_ms=Distribution.of([r.last_chunk_s * 1000 for r in records if r.last_chunk_s is not None]),
        errors=tuple(dict.fromkeys(o.error or "stopped" for o in level.outcomes if not o.ok)),
        interrupted=level.interrupted,
    )


@dataclass(frozen=True)
class TurnFigures:
    """The requests of one turn number (turn 1, turn 2...) of a level's conversations: how long their
    first token took, and how much of their prompt the engine took from its cache."""

    turn: int
    completed: int
    ttft_ms: Distribution
    mean_input_tokens: float | None
    mean_cached_input_tokens: float | None  # None: the engine did not report its cache

    @property
    def cached_share(self) -> float | None:
        if self.mean_cached_input_tokens is None or not self.mean_input_tokens:
            return None
        return self.mean_cached_input_tokens / self.mean_input_tokens


def by_turn(outcomes: Sequence[RequestOutcome]) -> list[TurnFigures]:
    """Each turn number's figures over the completed requests (one row, turn 1, for single prompts)."""
    turns: list[TurnFigures] = []
    for turn in sorted({outcome.turn for outcome in outcomes}):
        done = [o for o in outcomes if o.turn == turn and o.ok]
        inputs = [o.input_tokens for o in done if o.input_tokens is not None]
        cached = [o.cached_input_tokens for o in done if o.cached_input_tokens is not None]
        turns.append(TurnFigures(
            turn=turn, completed=len(done),
            ttft_ms=Distribution.of([o.record.first_token_s * 1000 for o in done if o.record.first_token_s is not None]),
            mean_input_tokens=statistics.fmean(inputs) if inputs else None,
            mean_cached_input_tokens=statistics.fmean(cached) if cached else None))
    return turns


def turns_line(turns: Sequence[TurnFigures]) -> str:
    """'turn 1: 412 ms (0% cached) · turn 2: 180 ms (86% cached) ...' - TTFT mean by turn number."""
    parts = []
    for figures in turns:
        ttft = "–" if figures.ttft_ms.mean is None else f"{figures.ttft_ms.mean:,.0f} ms"
        share = figures.cached_share
        cached = "cache not reported" if share is None else f"{share:.0%} of the prompt cached"
        parts.append(f"turn {figures.turn}: {ttft} ({cached})")
    return " · ".join(parts)


REQUEST_COLUMNS = ("backend", "stand_in", "max_concurrency", "index", "prompt", "conversation", "turn", "success",
                   "input_len", "cached_input_len", "output_len", "ttft_ms", "tpot_ms", "e2el_ms", "itl_mean_ms",
                   "itl_max_ms", "decode_tokens_per_s", "tokens_exact", "started_at_unix_s", "error")


def request_row(level: LevelResult, outcome: RequestOutcome, *, stand_in: bool) -> dict:
    """One request as a CSV row (vLLM's per-request names where they exist: input_len, output_len...).

    `stand_in`: the backend only stands in for the engine it is named after (the
    TGI-protocol test server), so its rows are not that engine's numbers.
    """
    record = outcome.record

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 3)

    return {
        "backend": level.backend, "stand_in": stand_in, "max_concurrency": level.concurrency, "index": outcome.index,
        "prompt": outcome.prompt_source, "conversation": outcome.conversation, "turn": outcome.turn,
        "success": outcome.ok, "input_len": outcome.input_tokens, "cached_input_len": outcome.cached_input_tokens,
        "output_len": record.output_tokens if record else None,
        "ttft_ms": ms(record.first_token_s) if record else None,
        "tpot_ms": None if not record or record.ms_per_output_token is None else round(record.ms_per_output_token, 3),
        "e2el_ms": ms(record.last_chunk_s) if record else None,
        "itl_mean_ms": None if not record or not record.chunk_gaps_s else
        round(statistics.fmean(record.chunk_gaps_s) * 1000, 3),
        "itl_max_ms": None if not record or record.itl is None else round(record.itl.max_ms, 3),
        "decode_tokens_per_s": None if not record or record.decode_tokens_per_s is None else
        round(record.decode_tokens_per_s, 3),
        "tokens_exact": record.tokens_exact if record else None,
        "started_at_unix_s": round(record.started_at_unix_s, 6) if record else None,
        "error": outcome.error or "",
    }


def as_json(summary: LevelSummary, level: LevelResult | None = None) -> dict:
    """A level's summary under vLLM's names, its distributions, and (given its requests) its figures by turn."""
    data = summary.vllm_fields() | {"distributions": {k: asdict(v) for k, v in (
        ("ttft_ms", summary.ttft_ms), ("tpot_ms", summary.tpot_ms), ("itl_ms", summary.itl_ms),
        ("e2el_ms", summary.e2el_ms))}}
    if level is not None:
        data["by_turn"] = [asdict(figures) for figures in by_turn(level.outcomes)]
    return data
