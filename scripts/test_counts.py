"""The README's test counts, from the suite itself.

Collects the suite (`pytest --collect-only`, nothing runs) and prints a markdown block: how many
tests there are, and how many use each real component, by the markers the fixtures set
(tests/conftest.py) and `slow`. The README holds this block between `<!-- test-counts:start -->`
and `<!-- test-counts:end -->`; tests/test_test_counts.py checks it equals what this prints now.

    .venv/bin/python scripts/test_counts.py           # print the block
    .venv/bin/python scripts/test_counts.py --write   # put it into README.md
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import io
import os
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
START, END = "<!-- test-counts:start -->", "<!-- test-counts:end -->"


def marker_descriptions() -> dict[str, str]:
    """pytest.ini's markers, name -> what it says (up to its first ';' or '(')."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "pytest.ini")
    described = {}
    for line in parser["pytest"]["markers"].strip().splitlines():
        name, _, text = line.partition(":")
        described[name.strip()] = re.split(r"[;(]", text, maxsplit=1)[0].strip()
    return described


class _Collected:
    """A pytest plugin that keeps each collected test's marker names."""

    def __init__(self) -> None:
        self.markers: list[set[str]] = []

    def pytest_collection_finish(self, session) -> None:
        self.markers = [{mark.name for mark in item.iter_markers()} for item in session.items]


def collect() -> list[set[str]]:
    """The marker names of every test in the suite, collected without running any."""
    import pytest

    collected = _Collected()
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[collected])
    if status != 0:
        raise SystemExit(f"collecting the suite failed (pytest exit {status}):\n{out.getvalue()[-3000:]}")
    return collected.markers


def counts_block(markers: list[set[str]], described: dict[str, str]) -> str:
    """The markdown block: all tests, then one row per marker, then the tests that use no real
    component (no marker but `slow`)."""
    per_marker = Counter(name for names in markers for name in names if name in described)
    components = set(described) - {"slow"}
    rows = [f"| all tests | {len(markers)} |"]
    rows += [f"| `{name}`: {text} | {per_marker[name]} |" for name, text in described.items()]
    plain = sum(1 for names in markers if not names & components)
    rows.append(f"| none of these components (fakes, stand-in servers, the embedded model in-process) | {plain} |")
    return "\n".join(["| tests | count |", "|---|---|", *rows])


def written(readme: str, block: str) -> str:
    """`readme` with the text between the markers replaced by `block`."""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return pattern.sub(lambda _: f"{START}\n{block}\n{END}", readme)


def readme_block(readme: str) -> str | None:
    """The block the README holds now, or None without the markers."""
    found = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), readme, re.S)
    return found.group(1) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="put the block into README.md")
    args = parser.parse_args()
    block = counts_block(collect(), marker_descriptions())
    if args.write:
        README.write_text(written(README.read_text(encoding="utf-8"), block), encoding="utf-8")
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
