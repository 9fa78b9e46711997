"""Benchmark prompt sets: the built-in Chinese and English sets, or your own JSONL file.

A prompt set is a JSONL file, one request per line. Each line is a JSON object with
either a "prompt" string (the format `vllm bench serve --dataset-name custom` reads)
or a "messages" list of {"role", "content"} objects ending with a user message, plus
two optional fields: "category" (a short tag) and "output_tokens" (the suggested
number of new tokens). Other fields are ignored; blank lines are skipped.

The built-in sets live in prompts/bench/ (see its README.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from backends.base import ChatMessage
from config import REPO

PROMPT_SETS_DIR = REPO / "prompts" / "bench"
BUILT_IN_SETS = ("zh", "en")
ROLES = ("system", "user", "assistant")


class PromptSetError(ValueError):
    """A prompt set could not be loaded. The message names the file, the line and what is wrong."""


# Builds the PromptSetError for one line, given what is wrong with it.
Fail = Callable[[str], PromptSetError]


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark request: the conversation to send and where it came from.

    `source` is "<set or file name>:<line number>", e.g. "zh:17" or "mine.jsonl:3".
    """

    messages: tuple[ChatMessage, ...]
    category: str | None
    output_tokens: int | None
    source: str


def load_prompt_set(spec: str) -> list[BenchPrompt]:
    """Load a built-in set ("zh", "en") or a JSONL file given by its path.

    Raises PromptSetError for an unknown set name, a missing or unreadable file,
    an empty file, or any line that is not a valid prompt.
    """
    if spec in BUILT_IN_SETS:
        return _load_jsonl(PROMPT_SETS_DIR / f"{spec}.jsonl", label=spec)
    path = Path(spec)
    if path.is_file():
        return _load_jsonl(path, label=path.name)
    if path.exists():
        raise PromptSetError(f"{spec} is not a file: give a JSONL file with one prompt per line")
    if "/" in spec or "\\" in spec or path.suffix:
        raise PromptSetError(f"Prompt file {spec} does not exist")
    raise PromptSetError(
        f"Unknown prompt set {spec!r}: use one of {', '.join(BUILT_IN_SETS)} or a path to a JSONL file"
    )


def prompt_text(prompt: BenchPrompt) -> str:
    """The text of the last user message: what the request asks."""
    for message in reversed(prompt.messages):
        if message.role == "user":
            return message.content
    raise ValueError(f"Prompt {prompt.source} has no user message")


def cycle(prompts: Sequence[BenchPrompt], n: int) -> list[BenchPrompt]:
    """The first n prompts, starting again from the first when n is larger than the set."""
    if n < 0:
        raise ValueError(f"Cannot take {n} prompts: the count must be 0 or more")
    if n > 0 and not prompts:
        raise ValueError(f"Cannot take {n} prompts from an empty prompt set")
    return [prompts[index % len(prompts)] for index in range(n)]


def _load_jsonl(path: Path, label: str) -> list[BenchPrompt]:
    try:
        # utf-8-sig: a file saved with a byte-order mark (some Windows editors) still loads.
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise PromptSetError(f"{path} is not UTF-8 text (byte {error.start}): save it as UTF-8") from error
    except OSError as error:
        raise PromptSetError(f"Cannot read prompt file {path}: {error.strerror}") from error
    prompts = [
        _parse_line(line, path, line_number, label)
        for line_number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not prompts:
        raise PromptSetError(f"{path} has no prompts: write one JSON object per line, e.g. {{\"prompt\": \"...\"}}")
    return prompts


def _parse_line(line: str, path: Path, line_number: int, label: str) -> BenchPrompt:
    def fail(problem: str) -> PromptSetError:
        return PromptSetError(f"{path}, line {line_number}: {problem}")

    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise fail(f"not valid JSON: {error.msg} (column {error.colno})") from error
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {_json_type(record)}")

    if "prompt" in record and "messages" in record:
        raise fail('has both "prompt" and "messages": keep one')
    if "prompt" in record:
        messages = (ChatMessage("user", _non_empty_string(record["prompt"], '"prompt"', fail)),)
    elif "messages" in record:
        messages = _messages(record["messages"], fail)
    else:
        raise fail('needs a "prompt" string or a "messages" list')

    category = record.get("category")
    if category is not None and not isinstance(category, str):
        raise fail(f'"category" must be a string, got {_json_type(category)}')
    if category is not None and not category.strip():
        category = None
    output_tokens = record.get("output_tokens")
    if output_tokens is not None and (
        isinstance(output_tokens, bool) or not isinstance(output_tokens, int) or output_tokens < 1
    ):
        raise fail(f'"output_tokens" must be a whole number of at least 1, got {json.dumps(output_tokens)}')

    return BenchPrompt(
        messages=messages,
        category=category,
        output_tokens=output_tokens,
        source=f"{label}:{line_number}",
    )


def _messages(value: Any, fail: Fail) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise fail(f'"messages" must be a non-empty list of {{"role", "content"}} objects, got {json.dumps(value)[:40]}')
    messages = []
    for index, item in enumerate(value):
        where = f'"messages"[{index}]'
        if not isinstance(item, dict):
            raise fail(f"{where} must be an object with role and content, got {_json_type(item)}")
        role = item.get("role")
        if role not in ROLES:
            raise fail(f"{where} has role {json.dumps(role)}: use one of {', '.join(ROLES)}")
        messages.append(ChatMessage(role, _non_empty_string(item.get("content"), f"{where} content", fail)))
    if messages[-1].role != "user":
        raise fail(f'the last message must be from the user, not the {messages[-1].role}')
    return tuple(messages)


def _non_empty_string(value: Any, what: str, fail: Fail) -> str:
    if not isinstance(value, str):
        raise fail(f"{what} must be a string, got {_json_type(value)}")
    if not value.strip():
        raise fail(f"{what} is empty")
    return value


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
