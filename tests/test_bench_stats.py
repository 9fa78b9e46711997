"""The benchmark's statistics and outputs on known inputs (no servers)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from datetime import datetime, timezone

import numpy
import pytest

from core.load.article import BenchmarkRun, EngineResult, RunSettings, article_table, write_outputs
from core.load.engine_memory import MemoryReading
from core.load.runner import LevelResult, RequestOutcome
from core.load.stats import Distribution, summarise
from core.timing import InterTokenLatency, RequestRecord


def record(first_token_s: float, gap_s: float, tokens: int, *, input_tokens: int = 10) -> RequestRecord:
    times = tuple(first_token_s + i * gap_s for i in range(tokens))
    return RequestRecord(
        backend="b", model="m", status="completed", started_at_unix_s=1.8e9, total_s=times[-1] + 0.01,
        first_byte_s=first_token_s, first_token_s=first_token_s, last_chunk_s=times[-1], output_tokens=tokens,
        decode_tokens_per_s=(tokens - 1) / (times[-1] - times[0]) if tokens > 1 else None,
        ms_per_output_token=(times[-1] - first_token_s) / (tokens - 1) * 1000 if tokens > 1 else None,
        itl=InterTokenLatency.of(times, (1,) * tokens), finish_reason="length", tokens_exact=True,
        token_source="", server=None, count_disagreement=None, chunk_times_s=times, chunk_tokens=(1,) * tokens,
    )


def level() -> LevelResult:
    outcomes = (
        RequestOutcome(0, "en:1", record(0.1, 0.02, 11), input_tokens=10),
        RequestOutcome(1, "en:2", record(0.3, 0.04, 6), input_tokens=20),
        RequestOutcome(2, "en:3", None, error="vLLM at http://x: the server is at capacity."),
    )
    return LevelResult("vllm", "vLLM", "m", concurrency=2, outcomes=outcomes, duration_s=2.0)


def test_summary_uses_vllms_definitions_on_known_requests():
    summary = summarise(level())
    assert (summary.completed, summary.failed) == (2, 1)
    assert summary.total_output_tokens == 17 and summary.total_input_tokens == 30
    assert summary.output_throughput == pytest.approx(17 / 2.0)
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.total_token_throughput == pytest.approx(47 / 2.0)
    assert summary.ttft_ms.mean == pytest.approx(200.0) and summary.ttft_ms.median == pytest.approx(200.0)
    # TPOT per request: 20 ms and 40 ms.
    assert summary.tpot_ms.mean == pytest.approx(30.0)
    # ITL pooled over all requests: ten gaps of 20 ms and five of 40 ms.
    gaps = [20.0] * 10 + [40.0] * 5
    assert summary.itl_ms.mean == pytest.approx(numpy.mean(gaps))
    assert summary.itl_ms.p99 == pytest.approx(numpy.percentile(gaps, 99))
    assert summary.itl_ms.std == pytest.approx(numpy.std(gaps))
    assert summary.e2el_ms.mean == pytest.approx(((0.1 + 0.2) + (0.3 + 0.2)) / 2 * 1000)
    assert summary.errors == ("vLLM at http://x: the server is at capacity.",)
    fields = summary.vllm_fields()
    for name in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                 "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms",
                 "max_concurrency", "duration"):
        assert name in fields
    assert fields["p99_itl_ms"] == summary.itl_ms.p99


def test_an_empty_distribution_has_no_numbers():
    assert Distribution.of([]) == Distribution(None, None, None, None, None)


def test_outputs_are_four_files_with_consistent_counts(tmp_path):
    result = level()
    engine = EngineResult("vllm", "vLLM", "m", "vLLM 0.32", None,
                          memory=MemoryReading(812.5, "process 1 on port 8001", None, "not measured (no GPU)"),
                          levels=[result], summaries=[summarise(result)])
    tgi_level = replace(result, backend="tgi", label="TGI")
    stand_in = EngineResult("tgi", "TGI", "m", None, "TGI-protocol test server, not TGI itself",
                            memory=MemoryReading(300.0, "process 2", None, "not measured (no GPU)"),
                            levels=[tgi_level], summaries=[summarise(tgi_level)])
    run = BenchmarkRun(RunSettings(concurrency=(2,), requests=3, max_new_tokens=11, prompt_set="en"),
                       [engine, stand_in], {"down": "not reachable"}, "test CPU, 2 cores",
                       datetime(2026, 12, 1, tzinfo=timezone.utc))
    paths = write_outputs(run, tmp_path / "out")
    assert sorted(path.name for path in paths.values()) == ["chart.png", "requests.csv", "summary.json", "table.md"]
    rows = list(csv.DictReader(open(paths["requests.csv"], encoding="utf-8")))
    assert len(rows) == 6 and sum(row["success"] == "True" for row in rows) == 4
    # The stand-in's requests say so in every row; the real engine's say they are not.
    assert {(row["backend"], row["stand_in"]) for row in rows} == {("vllm", "False"), ("tgi", "True")}
    summary = json.loads(paths["summary.json"].read_text())
    for engine_summary in summary["engines"]:
        (only,) = engine_summary["levels"]
        rows_of = [r for r in rows if r["backend"] == engine_summary["backend"] and r["success"] == "True"]
        assert only["total_output_tokens"] == sum(int(r["output_len"]) for r in rows_of) == 17
        assert only["completed"] == len(rows_of)
    table = paths["table.md"].read_text()
    assert "| | vLLM | TGI † |" in table
    assert "| GPU memory after load | not measured (no GPU) | not measured (no GPU) |" in table
    assert "| CPU memory (RSS of the serving process) | 812 MiB | 300 MiB |" in table
    assert "| TTFT (ms), mean at 2 concurrent | 200.0 | 200.0 |" in table
    assert "tokens/s at 2 concurrent (all requests) | 8.5 | 8.5 |" in table
    assert "† TGI is a stand-in: TGI-protocol test server" in table
    assert "Not measured: down: not reachable" in table and "failed requests | 1 | 1 |" in table
    assert paths["chart.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert article_table(run) == table
