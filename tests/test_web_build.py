"""The custom element the browser runs is the one its source builds (web/metrics-view.jsx).

public/serving-lab-metrics.js and public/elements/Metrics.jsx are committed build output (the app
needs no Node to run); these tests build them again with the pinned sucrase and fail on any
difference, so an edit of the source that was not built, or of the output by hand, cannot land.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def node() -> str:
    found = shutil.which("node")
    if found is None or not (ROOT / "node_modules" / "sucrase").is_dir():
        pytest.fail("node and the web tools are needed: run `bash scripts/setup.sh --test` (npm ci)")
    return found


def test_the_committed_element_is_what_its_source_builds_now():
    result = subprocess.run([node(), "scripts/build_web.mjs", "--check"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_check_fails_when_the_source_changed_without_a_build(tmp_path):
    """Control: the check is not a check that always passes."""
    copy = tmp_path / "repo"
    for part in ("scripts/build_web.mjs", "web", "public", "package.json"):
        source = ROOT / part
        target = copy / part
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    (copy / "node_modules").symlink_to(ROOT / "node_modules")
    view = copy / "web" / "metrics-view.jsx"
    view.write_text(view.read_text().replace('ttft: "TTFT"', 'ttft: "Time to first token"', 1))
    result = subprocess.run([node(), "scripts/build_web.mjs", "--check"], cwd=copy, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "public/serving-lab-metrics.js" in result.stderr


def test_the_stand_in_loads_the_build_it_names_and_reads_no_runner_global_in_the_view():
    element = (ROOT / "public" / "elements" / "Metrics.jsx").read_text()
    built = (ROOT / "public" / "serving-lab-metrics.js").read_text()
    (version,) = re.findall(r'ServingLab\.element\("([0-9a-f]{12})"', element)
    assert f'"{version}": defineView' in built
    view = (ROOT / "web" / "metrics-view.jsx").read_text()
    code = "\n".join(line for line in view.splitlines() if not line.lstrip().startswith("//"))
    # Chainlit's runner hands `props` and `callAction` to each evaluation of Metrics.jsx; the view is
    # made once, so reading them there would show the first evaluation's values for ever.
    assert not re.search(r"\bprops\.", code) and not re.search(r"(?<!api\.)\bcallAction\(", code)
