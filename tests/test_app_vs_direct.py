"""`python -m experiments.app_vs_direct`: the app and the direct path against the real vLLM, tiny settings.

What must hold on any machine: both paths measured every request, each path's
own token count equals the change in vLLM's `generation_tokens_total` over its
phase, and the same greedy prompts gave both paths the same tokens. The ratio
is only checked for sanity (a fast or a loaded machine moves it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments.app_vs_direct import Phase, Run, exit_status, in_flight, phase_order
from config import REPO


def test_phases_alternate_abba_and_in_flight_is_busy_time_over_wall_time():
    assert phase_order(2) == ["direct", "app", "app", "direct"]
    assert phase_order(1) == ["direct", "app"]
    assert in_flight([2.0, 3.0, 1.0], 2.0) == 3.0 and in_flight([], 2.0) is None


@pytest.mark.slow
def test_both_paths_are_measured_with_counts_equal_to_vllms_own(tmp_path, vllm_base_url):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.app_vs_direct", "--vllm-url", vllm_base_url, "--sessions", "2",
         "--prompts-per-session", "2", "--max-new-tokens", "16", "--rounds", "1", "--goal-ratio", "0.2",
         "--out", str(tmp_path)],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "req" in result.stderr  # the progress bar
    assert "output tokens/s, app / direct (pooled)" in result.stdout and "All 3 goals met." in result.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").read_text().startswith("# App vs direct")
    phases = data["phases"]
    assert [phase["path"] for phase in phases] == ["direct", "app"]
    for phase in phases:
        assert phase["requests"] == 4 and phase["completed"] == 4 and phase["errors"] == [], phase
        assert 4 <= phase["output_tokens"] <= 4 * 16
        assert phase["vllm_generation_tokens"] == phase["output_tokens"], phase
        assert phase["ttft_p50_ms"] > 0 and phase["wall_s"] > 0
    assert phases[1]["tab_ttft_p50_ms"] > 0
    assert phases[0]["output_tokens"] == phases[1]["output_tokens"]  # same prompts, greedy
    assert data["counts_agree"] is True
    assert data["ratio_app_over_direct"] >= 0.2 and data["goal_met"] is True


def _phase(number: int, path: str, tokens: int, counter: int, completed: int = 4) -> Phase:
    return Phase(number=number, path=path, requests=4, completed=completed, output_tokens=tokens,
                 vllm_generation_tokens=counter, wall_s=2.0)


def _run(*phases: Phase) -> Run:
    return Run(settings={}, phases=list(phases))


def test_verdict_meets_the_goal_only_with_ratio_counts_and_completions(capsys):
    assert exit_status(_run(_phase(1, "direct", 100, 100), _phase(2, "app", 95, 95))) == 0
    # ratio 0.85 < 0.9
    assert exit_status(_run(_phase(1, "direct", 100, 100), _phase(2, "app", 85, 85))) == 1
    assert "MISSED: output tokens/s, app / direct (pooled): 0.850" in capsys.readouterr().err
    # the ratio is fine but the app's count differs from vLLM's counter: no longer a pass
    assert exit_status(_run(_phase(1, "direct", 100, 100), _phase(2, "app", 100, 101))) == 1
    assert "MISSED: phases whose output tokens equal" in capsys.readouterr().err
    # a failed request
    assert exit_status(_run(_phase(1, "direct", 100, 100), _phase(2, "app", 100, 100, completed=3))) == 1
    assert "MISSED: requests completed: 7" in capsys.readouterr().err
    # nothing measured
    assert exit_status(_run()) == 1
