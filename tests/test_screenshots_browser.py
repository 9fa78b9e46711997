"""The docs' pictures are taken by running the app: every view is reached, drawn and passes axe-core.

`scripts/screenshots.py` starts its own paced servers, the app and chromium, walks through every
view and writes one PNG per view; it exits 1 on a view it could not reach or a serious or
critical axe-core violation. Here it writes into a temporary folder (the committed pictures in
docs/images/ are left alone), and each file must be a real, non-trivial picture.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from PIL import Image

from config import REPO
from scripts.screenshots import AXE_PATH, PHONE, VIEWPORT, VIEWS, axe_violations
from servers.browser import CHROMIUM_PATH
from servers.process import PYTHON

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT_TIMEOUT_S = 540


def picture_problems(path: Path, width: int) -> list[str]:
    """Why `path` is not a real picture of a page `width` pixels wide (empty list: it is one)."""
    if not path.exists():
        return [f"{path.name} was not written"]
    problems = []
    if path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        problems.append(f"{path.name} is not a PNG")
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        if image.size[0] != width or image.size[1] < 400:
            problems.append(f"{path.name} is {image.size}, not a {width} px wide page")
        colours = image.convert("RGB").getcolors(maxcolors=4096)
        if colours is not None and len(colours) < 8:
            problems.append(f"{path.name} has {len(colours)} colours: a blank page, not a view")
    if path.stat().st_size < 8_000:
        problems.append(f"{path.name} is {path.stat().st_size} bytes: too small to hold a view")
    return problems


def test_the_screenshot_script_draws_every_view_and_axe_core_finds_no_serious_violation(tmp_path):
    if not Path(CHROMIUM_PATH).exists():
        pytest.skip(f"no chromium at {CHROMIUM_PATH} (install Debian's chromium or set CHROMIUM_PATH)")
    assert AXE_PATH.exists(), "axe-core is not installed: run `npm ci` (scripts/setup.sh --test does)"
    done = subprocess.run([PYTHON, "-m", "scripts.screenshots", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, f"the script failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(f"{view}.png" for view in VIEWS)
    problems = [problem for view in VIEWS for problem in picture_problems(
        tmp_path / f"{view}.png", PHONE["width"] if view == "compare-phone" else VIEWPORT["width"])]
    assert not problems, problems
    # Control: a blank page of the same size is told apart from a view.
    blank = tmp_path / "blank.png"
    Image.new("RGB", (VIEWPORT["width"], VIEWPORT["height"]), "white").save(blank)
    assert picture_problems(blank, VIEWPORT["width"])


def test_the_axe_check_reports_a_nameless_button_and_passes_the_same_button_named(page):
    """The control of the check above: axe-core, as the script runs it, does flag a serious
    violation (an icon-only button without a name), and not once the button has a name."""
    page.set_content('<html lang="en"><head><title>t</title></head><body><main>'
                     '<button id="icon"><svg width="16" height="16"></svg></button></main></body></html>')
    found = axe_violations(page, "control")
    assert any(line.startswith("button-name (critical)") and "#icon" in line for line in found), found
    page.evaluate("() => document.getElementById('icon').setAttribute('aria-label', 'Send message')")
    assert axe_violations(page, "control") == []
