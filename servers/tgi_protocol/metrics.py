"""The stand-in's GET /metrics: TGI's own metric names, kept and written as TGI's router does (3.x).

Counters are written without `_total`, as TGI's exporter (metrics-exporter-prometheus)
writes them; histograms use TGI's buckets and are observed when a request succeeds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from servers.tgi_protocol.errors import InferError

if TYPE_CHECKING:
    from servers.tgi_protocol.engines import Job

# TGI's `err` label of tgi_request_failure, where it differs from the error_type it sends.
FAILURE_REASONS = {"incomplete_generation": "incomplete"}


def tgi_duration_buckets() -> list[float]:
    """The buckets TGI's router gives every `*_duration` histogram: 35 steps of x1.5 above 0.1 ms."""
    return [0.0001 * 1.5 ** step for step in range(1, 36)]


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, name: str, buckets: list[float]) -> None:
        self.name = name
        self.buckets = buckets
        self.bucket_counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, upper_bound in enumerate(self.buckets):
            if value <= upper_bound:
                self.bucket_counts[index] += 1
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        lines = [f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{upper_bound}"}} {count}'
                  for upper_bound, count in zip(self.buckets, self.bucket_counts)]
        return lines + [f'{self.name}_bucket{{le="+Inf"}} {self.count}',
                        f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]


class ServerMetrics:
    """The figures GET /metrics reports, kept as TGI's router keeps them (3.x)."""

    def __init__(self, max_total_tokens: int) -> None:
        self.request_count = 0
        self.request_success = 0
        self.request_failure_by_reason: dict[str, int] = {}
        self.mean_time_per_token = Histogram("tgi_request_mean_time_per_token_duration", tgi_duration_buckets())
        self.queue_duration = Histogram("tgi_request_queue_duration", tgi_duration_buckets())
        self.generated_tokens = Histogram(
            "tgi_request_generated_tokens", [max_total_tokens / 100 * step for step in range(1, 101)])

    def failed(self, error: InferError) -> None:
        reason = FAILURE_REASONS.get(error.error_type, error.error_type)
        self.request_failure_by_reason[reason] = self.request_failure_by_reason.get(reason, 0) + 1

    def succeeded(self, job: "Job", generated_tokens: int) -> None:
        """At the end of a successful request, as TGI does: time per token is the time since a worker
        took the request (prefill included) divided by the tokens generated."""
        finished_at_s = time.monotonic()
        running_at_s = job.running_at_s if job.running_at_s is not None else job.queued_at_s
        self.request_success += 1
        self.mean_time_per_token.observe((finished_at_s - running_at_s) / generated_tokens)
        self.queue_duration.observe(running_at_s - job.queued_at_s)
        self.generated_tokens.observe(generated_tokens)

    def render(self, queue_size: int, batch_size: int) -> str:
        """Prometheus text: `tgi_queue_size` generations waiting for the engine, `tgi_batch_current_size`
        generations running (0 or 1 on the llama.cpp engine, as many as stream on the paced one)."""
        blocks = [
            ["# TYPE tgi_request_count counter", f"tgi_request_count {self.request_count}"],
            ["# TYPE tgi_request_success counter", f"tgi_request_success {self.request_success}"],
            ["# TYPE tgi_queue_size gauge", f"tgi_queue_size {queue_size}"],
            ["# TYPE tgi_batch_current_size gauge", f"tgi_batch_current_size {batch_size}"],
        ]
        if self.request_failure_by_reason:
            blocks.append(["# TYPE tgi_request_failure counter"] + [
                f'tgi_request_failure{{err="{reason}"}} {count}'
                for reason, count in sorted(self.request_failure_by_reason.items())])
        blocks += [self.mean_time_per_token.lines(), self.queue_duration.lines(), self.generated_tokens.lines()]
        return "\n\n".join("\n".join(block) for block in blocks) + "\n"
