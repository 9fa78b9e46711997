"""Convert a Chatbot Arena battle log into this app's battle JSONL, to rate it offline.

    python -m core.ratings.arena_convert ARENA_FILE OUT.jsonl
    python -m core.ratings --votes OUT.jsonl --control length,style

ARENA_FILE is a JSON array of battles (e.g. FastChat's clean_battle_*.json) or one battle
per line (JSONL, as the Hugging Face exports of Arena's human-preference data). Assumptions
about Arena's fields, as its public logs and style-control notebook use them:

- `model_a`, `model_b`: the two models; `winner`: `model_a`, `model_b`, `tie` or
  `tie (bothbad)` (`both_bad`, used by some newer exports, is read as `tie (bothbad)`).
- `question_id` (older logs) or `id` (newer): the battle's id, kept as `round_id`. Each Arena
  battle is its own round; a repeated id gets its line number appended.
- `conversation_a/b`: lists of {"role", "content"} where content is text or a list of
  {"type": "text", "text": ...} parts; the first user message is the prompt, the assistant
  messages (joined) the reply. Multi-turn battles are judged whole, as in Arena.
- `conv_metadata`: `sum_assistant_a_tokens` (the length), `header_count_a` ({h1..h6}),
  `list_count_a` ({ordered, unordered}), `bold_count_a` ({"**", "__"}) and the same for b.
  Copied as they are; without them the length is unknown (no length difference) and the
  markdown is counted in the reply text.
- `anony`: whether the names were hidden (Arena rates only these); absent means true.
- `language`: "English" / "Chinese" (older logs) or a code ("en", "zh"); names become codes
  for these two, any other value is kept lower-cased; absent: by the prompt's script.
- `judge`, `tstamp` (Unix seconds) or `timestamp` (ISO text): kept.
- Category: "code" when `is_code` is true, else "math" when `category_tag.math_v0.1.math`
  is, else "creative" when `category_tag.creative_writing_v0.1.creative_writing` is, else
  "free" (every Arena prompt was typed by a person).

Arena logs carry no speed figures, so a converted file has no speed effect (reveal null).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from core.ratings.battles import FREE_CATEGORY, Battle, BattleFileError, battle_from_json, write_battles

LANGUAGE_CODES = {"english": "en", "chinese": "zh", "en": "en", "zh": "zh"}
WINNER_ALIASES = {"both_bad": "tie (bothbad)"}


def arena_records(text: str, source: str) -> list[dict[str, Any]]:
    """The battles of an Arena file's text: a JSON array, or one JSON object per line."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise BattleFileError(f"{source}: not valid JSON ({error.msg}, line {error.lineno}).") from error
        return records
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise BattleFileError(f"{source}, line {number}: not valid JSON ({error.msg}).") from error
    return records


def convert_record(record: Any, round_id: str) -> Battle:
    """One Arena battle as one of this app's battles (see core/ratings/battles.py)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    winner = record.get("winner")
    converted = {
        "round_id": round_id,
        "model_a": record.get("model_a"),
        "model_b": record.get("model_b"),
        "winner": WINNER_ALIASES.get(winner, winner),
        "judge": record.get("judge"),
        "anony": bool(record.get("anony", True)),
        "tstamp": _timestamp(record),
        "category": _category(record),
        "conversation_a": record.get("conversation_a") or [],
        "conversation_b": record.get("conversation_b") or [],
        "conv_metadata": record.get("conv_metadata") or {},
        "reveal": None,
    }
    language = record.get("language")
    if isinstance(language, str) and language.strip():
        converted["language"] = LANGUAGE_CODES.get(language.strip().lower(), language.strip().lower())
    return battle_from_json(converted)  # the same checks as reading the file back


def convert(records: Iterable[Any], source: str = "the Arena file") -> list[Battle]:
    """Every Arena battle converted, each with a round id of its own."""
    converted, seen = [], set()
    for number, record in enumerate(records, start=1):
        identifier = str(record.get("question_id") or record.get("id") or f"arena-{number}") \
            if isinstance(record, dict) else f"arena-{number}"
        if identifier in seen:
            identifier = f"{identifier}-{number}"
        seen.add(identifier)
        try:
            converted.append(convert_record(record, identifier))
        except (ValueError, TypeError) as error:
            raise BattleFileError(f"{source}, battle {number}: {error}") from error
    return converted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.ratings.arena_convert",
                                     description="Convert a Chatbot Arena battle log into this app's battle JSONL.")
    parser.add_argument("arena_file", help="Arena battles: a JSON array or JSONL")
    parser.add_argument("output", help="the battle JSONL to write (rate it with python -m core.ratings --votes)")
    args = parser.parse_args(argv)
    source = Path(args.arena_file)
    try:
        converted = convert(arena_records(source.read_text(encoding="utf-8-sig"), str(source)), str(source))
    except OSError as error:
        print(f"error: cannot read {source}: {error.strerror}", file=sys.stderr)
        return 1
    except BattleFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    with open(args.output, "w", encoding="utf-8") as stream:
        write_battles(converted, stream)
    print(f"{len(converted)} battle(s) written to {args.output}")
    return 0


def _timestamp(record: dict) -> float | None:
    if isinstance(record.get("tstamp"), (int, float)):
        return float(record["tstamp"])
    if isinstance(record.get("timestamp"), str):
        try:
            moment = datetime.fromisoformat(record["timestamp"])
        except ValueError:
            return None
        # Arena's exports write UTC without a zone.
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    return None


def _category(record: dict) -> str:
    tags = record.get("category_tag") or {}
    if record.get("is_code"):
        return "code"
    if (tags.get("math_v0.1") or {}).get("math"):
        return "math"
    if (tags.get("creative_writing_v0.1") or {}).get("creative_writing"):
        return "creative"
    return FREE_CATEGORY


if __name__ == "__main__":
    sys.exit(main())
