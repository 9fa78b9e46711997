"""Benchmark prompt sets: the built-in Chinese and English sets, or your own JSONL file.

A prompt set is a JSONL file, one request per line. Each line is a JSON object with
either a "prompt" string (the format `vllm bench serve --dataset-name custom` reads)
or a "messages" list of {"role", "content"} objects ending with a user message, plus
two optional fields: "category" (a short tag) and "output_tokens" (the suggested
number of new tokens). Other fields are ignored; blank lines are skipped.

The built-in sets live in prompts/bench/ (see its README.md).

A conversation set (prompts/conversations/, or your own JSONL file) holds whole conversations, one
a line: a "system" prompt (a class shares one) and the student's "turns" in order; each turn is sent
with the conversation so far, the engine's own earlier replies included (`Conversation`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from backends.base import ChatMessage
from config import REPO

PROMPT_SETS_DIR = REPO / "prompts" / "bench"
CONVERSATION_SETS_DIR = REPO / "prompts" / "conversations"
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


@dataclass(frozen=True)
class Conversation:
    """A scripted conversation of one student: the class's system prompt and the turns they type.

    `source` is "<set or file name>:<line number>", e.g. "en:3". Turn n (from 1) is sent as the
    system prompt, every earlier turn with the reply the engine really gave, then turn n.
    """

    system: str | None
    turns: tuple[str, ...]
    category: str | None
    output_tokens: int | None
    source: str

    def messages(self, replies: Sequence[str]) -> tuple[ChatMessage, ...]:
        """The request of turn `len(replies) + 1`, after the engine gave `replies` to the turns before."""
        if len(replies) >= len(self.turns):
            raise ValueError(f"conversation {self.source} has {len(self.turns)} turns")
        messages = [ChatMessage("system", self.system)] if self.system else []
        for question, reply in zip(self.turns, replies):
            messages += [ChatMessage("user", question), ChatMessage("assistant", reply)]
        return (*messages, ChatMessage("user", self.turns[len(replies)]))


def load_conversation_set(spec: str) -> list[Conversation]:
    """Load a built-in conversation set ("en", "zh") or a JSONL file of conversations by its path.

    Each line: {"system": "...", "turns": ["...", "..."]} plus optional "id", "category" and
    "output_tokens". Raises PromptSetError naming the file, the line and what is wrong."""
    if spec in BUILT_IN_SETS:
        path, label = CONVERSATION_SETS_DIR / f"{spec}.jsonl", f"conversations-{spec}"
    else:
        path, label = Path(spec), Path(spec).name
        if not path.is_file():
            raise PromptSetError(f"Unknown conversation set {spec!r}: use one of {', '.join(BUILT_IN_SETS)} "
                                 "or a path to a JSONL file of conversations")
    conversations = [_parse_conversation(line, path, number, label)
                     for number, line in enumerate(_read_lines(path), start=1) if line.strip()]
    if not conversations:
        raise PromptSetError(f'{path} has no conversations: write one per line, e.g. {{"turns": ["...", "..."]}}')
    return conversations


def _parse_conversation(line: str, path: Path, line_number: int, label: str) -> Conversation:
    def fail(problem: str) -> PromptSetError:
        return PromptSetError(f"{path}, line {line_number}: {problem}")

    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise fail(f"not valid JSON: {error.msg} (column {error.colno})") from error
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {_json_type(record)}")
    turns = record.get("turns")
    if not isinstance(turns, list) or not turns:
        raise fail('needs a "turns" list: the student\'s messages in order')
    system = record.get("system")
    prompt = _parse_line(json.dumps({"prompt": "x", **{k: record[k] for k in ("category", "output_tokens")
                                                       if k in record}}), path, line_number, label)
    return Conversation(
        system=None if system is None else _non_empty_string(system, '"system"', fail),
        turns=tuple(_non_empty_string(turn, f'"turns"[{index}]', fail) for index, turn in enumerate(turns)),
        category=prompt.category, output_tokens=prompt.output_tokens, source=f"{label}:{line_number}")


def _read_lines(path: Path) -> list[str]:
    try:
        # utf-8-sig: a file saved with a byte-order mark (some Windows editors) still loads.
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as error:
        raise PromptSetError(f"{path} is not UTF-8 text (byte {error.start}): save it as UTF-8") from error
    except OSError as error:
        raise PromptSetError(f"Cannot read prompt file {path}: {error.strerror}") from error


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
    prompts = [
        _parse_line(line, path, line_number, label)
        for line_number, line in enumerate(_read_lines(path), start=1)
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
