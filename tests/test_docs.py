"""The docs: the site builds with `mkdocs build --strict` (a broken link or anchor fails it), the
reference pages are what the code declares today, and the README's links and commands are true.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import REPO

sys.path.insert(0, str(REPO / "scripts"))
import docs_reference  # noqa: E402  (scripts/ is not a package)

MKDOCS = Path(sys.executable).with_name("mkdocs")


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the docs under `root` (never -q: it hides the warnings strict counts)."""
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=root,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=180)


def test_the_docs_site_builds_with_strict_checks_and_a_broken_anchor_fails_it(tmp_path):
    built = build_site(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "environment" / "index.html").exists()
    # Control: the same docs with one link to an anchor that no heading has must fail the build.
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "known-limits.md", "a", encoding="utf-8") as page:
        page.write("\nSee [the settings](configuration.md#no-such-anchor-here).\n")
    broken = build_site(copy, tmp_path / "broken-site")
    assert broken.returncode != 0
    assert "no-such-anchor-here" in broken.stdout + broken.stderr


def test_the_reference_pages_are_what_the_code_declares_today():
    generated = docs_reference.pages()
    for name, text in generated.items():
        committed = (REPO / "docs" / "reference" / name).read_text(encoding="utf-8")
        assert committed == text, f"docs/reference/{name} is stale: run .venv/bin/python scripts/docs_reference.py"


def test_the_environment_page_lists_every_declared_variable():
    from backends.registry import KINDS
    from config import GLOBAL_VARIABLES

    page = docs_reference.environment_page()
    for name in GLOBAL_VARIABLES:
        assert f"### `{name}`" in page, name
    for kind in KINDS:
        assert f"### Kind `{kind.name}`" in page
        section = page.split(f"### Kind `{kind.name}`")[1].split("###")[0]
        for variable in kind.declared_variables:
            assert f"| `N_{variable.name}` |" in section, (kind.name, variable.name)


def test_the_commands_page_lists_every_command_with_its_flags():
    page = docs_reference.commands_page()
    commands = dict(docs_reference.command_modules())
    # Every module of the repository that builds an argparse parser in its main is a command.
    for expected in ("python -m bench", "python -m bench sweep", "python -m bench replay", "python -m store",
                     "python -m core.ratings", "python -m experiments.vllm_agreement",
                     "python scripts/vllm_launch.py"):
        assert expected in commands and f"### `{expected}`" in page, expected
    for script in sorted((REPO / "scripts").glob("*.sh")):
        assert f"### `bash scripts/{script.name}`" in page, script.name
    sweep = page.split("### `python -m bench sweep`")[1].split("\n### ")[0]
    assert "| `--concurrency` |" in sweep and "| `--slo` |" in sweep


def test_a_flag_added_to_a_parser_shows_on_the_commands_page():
    """The page is read from the parser itself: a parser built at run time with a new flag shows it."""
    def main(argv=None):
        import argparse
        parser = argparse.ArgumentParser(description="A command for this test.")
        parser.add_argument("--brand-new-flag", type=int, default=7, help="added just now")
        parser.parse_args(argv)
        raise AssertionError("the parse must be stopped before the command runs")

    parser = docs_reference.captured_parser(main)
    assert [action.option_strings for action in parser._actions][-1] == ["--brand-new-flag"]


def test_the_env_example_comments_are_read_per_variable():
    text = "# ---\n# Section intro.\n# First one.\nA=1\nB=2\n\n# Third.\n# C=example\nC=\n"
    assert docs_reference.env_example_comments(text) == {
        "A": ["Section intro.", "First one."], "B": ["Section intro.", "First one."], "C": ["Third."]}


README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_landing_page_whose_links_and_pictures_exist():
    assert len(README.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)]+)\)", README)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert any(target.startswith("docs/images/") for target in local)
    for target in local:
        path = target.split("#")[0]
        assert (REPO / path).exists(), f"README links to {target}, which does not exist"
        anchor = target.partition("#")[2]
        if anchor:
            # An anchor into a docs page: the page must have it (the site build checks the pages' own).
            site_page = path.removeprefix("docs/").removesuffix(".md")
            html = _built_page(site_page)
            assert f'id="{anchor}"' in html, f"README links to {target}: no such anchor"


_SITE: dict[str, Path] = {}


def _built_page(page: str) -> str:
    if "site" not in _SITE:
        import tempfile
        _SITE["site"] = Path(tempfile.mkdtemp(prefix="docs-site-")) / "site"
        built = build_site(REPO, _SITE["site"])
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    folder = _SITE["site"] if page == "index" else _SITE["site"] / page.removesuffix("/index")
    return (folder / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", [
    "bash scripts/setup.sh && .venv/bin/chainlit run app.py -w",  # .ci/run stage 1 and first_run_check.sh
    "bash scripts/test.sh",  # .ci/run stage 2
])
def test_the_readme_gives_the_commands_ci_runs(command):
    assert f"```bash\n{command}\n```" in README
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert command.split(" && ")[0] in ci


def test_the_readme_keeps_its_test_counts_block():
    start, end = README.index("<!-- test-counts:start -->"), README.index("<!-- test-counts:end -->")
    assert start < end and "| all tests |" in README[start:end]  # scripts/test_counts.py's table
