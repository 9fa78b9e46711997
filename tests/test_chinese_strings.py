"""The Chinese UI covers the English one: every string the app shows in English has a Chinese
counterpart with the same placeholders, in each place strings live - the custom element's tables
(web/metrics-view.jsx, the source of the built element, evaluated by the node Playwright ships), the app's own strings (core/texts.py, the
leaderboard's merged in) and Chainlit's chrome (.chainlit/translations)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from config import REPO
from core.texts import STRINGS

ELEMENT = REPO / "web" / "metrics-view.jsx"
ELEMENT_TABLES = ("LABELS", "PANEL")
# Words that are the same in both languages (units, percentiles, symbols).
SAME_IN_BOTH = {"p90", "p99", "tokens", "token →", "…", "Top-p"}
SAME_KEYS = {"unknown_backend"}  # core/texts.py keys whose text is the same in both (names, a backend's list)
HAN = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # CJK ideographs and punctuation


def playwright_node() -> str:
    """The node that Playwright (a test requirement) ships to drive browsers: no system node needed."""
    from playwright._impl._driver import compute_driver_executable

    node = compute_driver_executable()[0]
    if not Path(node).exists():
        pytest.fail(f"Playwright's node is missing at {node}: reinstall playwright (requirements-dev.txt)", pytrace=False)
    return str(node)


def element_tables(source: str | None = None) -> dict[str, dict]:
    """Each string table of the custom element (or of `source`, its text), per language:
    key -> {"kind", "arity", "source"}."""
    node = playwright_node()
    source = ELEMENT.read_text(encoding="utf-8") if source is None else source
    literals = {}
    for name in ELEMENT_TABLES:
        found = re.search(rf"^( *)const {name} = \{{", source, re.MULTILINE)
        assert found, f"no table {name} in {ELEMENT.name}"
        start, indent = found.start(), found.group(1)
        end = source.index(f"\n{indent}}};\n", start)
        literals[name] = source[found.end() - 1:end + len(indent) + 2]
    script = ("const tables = {" + ",".join(f"{name}: ({text})" for name, text in literals.items()) + "};\n"
              "const out = {};\n"
              "for (const [table, langs] of Object.entries(tables)) {\n"
              "  out[table] = {};\n"
              "  for (const [lang, strings] of Object.entries(langs)) {\n"
              "    out[table][lang] = Object.fromEntries(Object.entries(strings).map(([key, value]) => [key,\n"
              "      {kind: typeof value, arity: typeof value === 'function' ? value.length : null, source: String(value)}]));\n"
              "  }\n"
              "}\n"
              "process.stdout.write(JSON.stringify(out));\n")
    result = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def placeholders(text: str) -> set[str]:
    """`{name}` (Python) and `${expression}` (JavaScript) placeholders in `text`."""
    return set(re.findall(r"\$\{([^}]*)\}", text)) | set(re.findall(r"(?<!\$)\{(\w+)", text))


def uncovered(table: dict[str, dict]) -> list[str]:
    """What the Chinese side of one element table lacks: keys, placeholders, kinds, Chinese text."""
    english, chinese = table["en"], table["zh"]
    problems = [f"no Chinese {key}" for key in english if key not in chinese]
    problems += [f"no English {key}" for key in chinese if key not in english]
    for key in set(english) & set(chinese):
        en, zh = english[key], chinese[key]
        if (zh["kind"], zh["arity"]) != (en["kind"], en["arity"]):
            problems.append(f"{key}: a {zh['kind']}/{zh['arity']} for a {en['kind']}/{en['arity']}")
        if not placeholders(zh["source"]) >= placeholders(en["source"]) - {'n > 1 ? "s" : ""'}:  # English plural
            problems.append(f"{key}: placeholders {placeholders(zh['source'])} for {placeholders(en['source'])}")
        if en["kind"] == "string" and en["source"] not in SAME_IN_BOTH and not HAN.search(zh["source"]):
            problems.append(f"{key}: not Chinese: {zh['source']!r}")
    return sorted(problems)


@pytest.mark.parametrize("table", ELEMENT_TABLES)
def test_the_custom_elements_chinese_strings_cover_its_english_ones(table):
    tables = element_tables()[table]
    assert len(tables["en"]) > 20, "few English strings read: the table's shape changed"
    assert uncovered(tables) == []


def test_a_string_missing_or_left_in_english_in_the_element_is_found():
    """The control: the same check on the element with one Chinese string taken out and one left in English."""
    source = ELEMENT.read_text(encoding="utf-8")
    broken = source.replace('allBad: "都不好",', "", 1).replace('tie: "平局"', 'tie: "Tie"', 1)
    assert broken.count("都不好") == source.count("都不好") - 1 and 'tie: "Tie"' in broken
    assert uncovered(element_tables(broken)["LABELS"]) == ["no Chinese allBad", "tie: not Chinese: 'Tie'"]


def test_the_apps_own_chinese_strings_cover_its_english_ones():
    english, chinese = STRINGS["en"], STRINGS["zh"]
    assert set(english) == set(chinese)
    for key, en in english.items():
        assert placeholders(chinese[key]) == placeholders(en), key
        if en not in SAME_IN_BOTH and re.search(r"[A-Za-z]{3}", en) and key not in SAME_KEYS:
            assert HAN.search(chinese[key]), (key, chinese[key])


def test_chainlits_chrome_has_every_english_string_in_chinese():
    def flat(tree: dict, prefix: str = "") -> dict[str, str]:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    translations = REPO / ".chainlit" / "translations"
    english = flat(json.loads((translations / "en-US.json").read_text(encoding="utf-8")))
    chinese = flat(json.loads((translations / "zh-CN.json").read_text(encoding="utf-8")))
    assert english and set(english) == set(chinese)
    for key, en in english.items():
        assert placeholders(chinese[key]) == placeholders(en), key
