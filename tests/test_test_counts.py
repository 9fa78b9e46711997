"""The README's test counts are the suite's own: the block between its test-counts markers equals
what scripts/test_counts.py prints from collecting the suite now."""

from __future__ import annotations

import subprocess
import sys

from config import REPO
from scripts.test_counts import counts_block, readme_block, written


def test_the_readmes_counts_are_what_the_suite_collects_now():
    printed = subprocess.run([sys.executable, "scripts/test_counts.py"], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert readme_block((REPO / "README.md").read_text(encoding="utf-8")) == printed.stdout.strip(), (
        "README.md's test counts are stale: run `.venv/bin/python scripts/test_counts.py --write`")


def test_the_block_counts_each_marker_and_the_tests_without_a_component():
    markers = [{"browser", "slow"}, {"vllm"}, {"slow"}, set(), {"browser", "postgres"}]
    block = counts_block(markers, {"vllm": "needs vLLM", "browser": "a browser", "postgres": "PostgreSQL",
                                   "slow": "slow"})
    assert block.splitlines() == [
        "| tests | count |", "|---|---|", "| all tests | 5 |", "| `vllm`: needs vLLM | 1 |",
        "| `browser`: a browser | 2 |", "| `postgres`: PostgreSQL | 1 |", "| `slow`: slow | 2 |",
        "| none of these components (fakes, stand-in servers, the embedded model in-process) | 2 |"]
    readme = "intro\n<!-- test-counts:start -->\nold\n<!-- test-counts:end -->\nrest\n"
    assert readme_block(written(readme, block)) == block and written(readme, block).endswith("end -->\nrest\n")
