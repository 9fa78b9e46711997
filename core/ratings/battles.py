"""Votes as a dataset: one pairwise battle per JSON line, shaped like Chatbot Arena's battle logs.

A voted round of 2-4 columns becomes the pairwise results the ratings count
(`compare.ratings.pairwise_outcomes`): the winner beats each other column, a tie
or both-bad ties every pair. Each pair is one `Battle`, written as one line:

| field | meaning |
|---|---|
| `round_id` | the voted round; the lines of one round share it (the bootstrap resamples rounds) |
| `model_a`, `model_b` | the configured backend names, in column order (A before B ...) |
| `winner` | `model_a`, `model_b`, `tie` or `tie (bothbad)` |
| `judge` | who voted (the login name), or null with login off |
| `anony` | true for a blind round (names hidden while judging): only these are rated |
| `tstamp` | when the vote was cast, Unix seconds |
| `language` | `zh` or `en` (the prompt set's, or by script for typed prompts) |
| `category` | the prompt-set line's category, or `free` for a prompt typed by a person |
| `conversation_a/b` | `[{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]` |
| `conv_metadata` | `sum_assistant_a_tokens`, `header_count_a` {h1..h6}, `list_count_a` {ordered, unordered}, `bold_count_a` {`**`, `__`}, and the same for b |
| `reveal` | `finished`, `pace` or `live` (how a blind round showed its text before the vote), or null |
| `speed_seen` | true when the round was stopped before its end and every partial text shown at once: its voter saw speed whatever the reveal |
| `side_a/b` | this app's figures per side: `column`, `label`, `model`, `status`, `first_token_s`, `decode_tokens_per_s`, `total_s`, `settings` (sent to the engine), `judged` (good/bad/null) |
| `comment` | the voter's comment (the same on every line of a round) |
| `rated` | false for a vote kept but not rated; `unrated_reason` says why |

The fields Arena's logs also have keep Arena's names and meaning (`model_a`,
`model_b`, `winner`, `judge`, `anony`, `tstamp`, `language`, `conversation_a/b`,
`conv_metadata`), so a converted Arena log (`python -m core.ratings.arena_convert`)
and this app's export are read by the same `read_battles`.

Everything here is plain Python: no database, no Chainlit.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TextIO

from core.ratings.ratings import RoundVote
from store.records import VoteRecord

WINNERS = ("model_a", "model_b", "tie", "tie (bothbad)")
FREE_CATEGORY = "free"  # a prompt typed by a person, not taken from a prompt set
LANGUAGES = ("zh", "en")
HEADER_LEVELS = ("h1", "h2", "h3", "h4", "h5", "h6")
LIST_KINDS = ("ordered", "unordered")
BOLD_MARKS = ("**", "__")

# Markdown, counted as Arena's style control does: outside fenced code blocks, a header is a
# line starting with 1-6 '#' and a space, a list item a line starting with "1." or "-", "*",
# "+" and a space, bold a run of text between ** ** or __ __ on one line.
_CODE_BLOCK = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_HEADER = re.compile(r"^(#{1,6})\s", re.MULTILINE)
_ORDERED_ITEM = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_UNORDERED_ITEM = re.compile(r"^\s*[-*+]\s", re.MULTILINE)
_BOLD = {"**": re.compile(r"\*\*[^*\n]+\*\*"), "__": re.compile(r"__[^_\n]+__")}
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_LATIN = re.compile(r"[A-Za-z]")
# A typed prompt is Chinese when at least this share of its letters are CJK characters
# ("Translate 你好 into English" is English; "把 hello world 翻译成中文" is Chinese).
CJK_SHARE_FOR_CHINESE = 0.2


class BattleFileError(ValueError):
    """A battle file could not be read; the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class MarkdownCounts:
    """Markdown elements of a reply, by kind, in the shape of Arena's conv_metadata."""

    headers: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(HEADER_LEVELS, 0))
    lists: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(LIST_KINDS, 0))
    bold: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(BOLD_MARKS, 0))

    @property
    def header_total(self) -> int:
        return sum(self.headers.values())

    @property
    def list_total(self) -> int:
        return sum(self.lists.values())

    @property
    def bold_total(self) -> int:
        return sum(self.bold.values())


def markdown_counts(reply: str) -> MarkdownCounts:
    """Count headers (by level), list items (ordered, unordered) and bold runs outside code blocks."""
    prose = _CODE_BLOCK.sub("", reply)
    headers = dict.fromkeys(HEADER_LEVELS, 0)
    for hashes in _HEADER.findall(prose):
        headers[f"h{len(hashes)}"] += 1
    return MarkdownCounts(
        headers=headers,
        lists={"ordered": len(_ORDERED_ITEM.findall(prose)), "unordered": len(_UNORDERED_ITEM.findall(prose))},
        bold={mark: len(pattern.findall(prose)) for mark, pattern in _BOLD.items()},
    )


def script_language(prompt: str) -> str:
    """"zh" when CJK characters make up at least CJK_SHARE_FOR_CHINESE of the letters, else "en"."""
    cjk = len(_CJK.findall(prompt))
    latin = len(_LATIN.findall(prompt))
    return "zh" if cjk and cjk >= CJK_SHARE_FOR_CHINESE * (cjk + latin) else "en"


@dataclass(frozen=True)
class PromptCatalogue:
    """Prompt text -> (category, language) for the lines of the prompt sets; anything else is a
    prompt typed by a person: category "free", language by script."""

    entries: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def from_sets(cls, sets: Mapping[str, Iterable[tuple[str, str | None]]]) -> "PromptCatalogue":
        """`sets` maps a language ("zh", "en") to its lines' (prompt, category); a line without a
        category is "uncategorised"."""
        entries: dict[str, tuple[str, str]] = {}
        for language, lines in sets.items():
            for prompt, category in lines:
                entries.setdefault(prompt.strip(), (category or "uncategorised", language))
        return cls(entries)

    def classify(self, prompt: str) -> tuple[str, str]:
        """(category, language) of a round's prompt."""
        return self.entries.get(prompt.strip()) or (FREE_CATEGORY, script_language(prompt))


# Reveal modes of a blind round in which the voter saw each side's speed before voting: "live"
# streams every column as its engine sends it (names hidden), so which side started first and
# ran faster is in plain view. "pace" shows every column at the pace of the slowest one still
# generating (core.rounds.RevealPace) and "finished" shows nothing until all have finished: in
# both, neither side's speed is shown, so their votes carry no speed effect - unless the round was
# stopped before its end, which shows every partial text at once (`Battle.speed_seen`).
SPEED_SHOWN_IN = frozenset({"live"})

@dataclass(frozen=True)
class Side:
    """One side of a battle: who answered, what, how long and how fast.

    `tokens` is the reply's output token count (Arena: sum_assistant_X_tokens); the speed
    figures are None where unknown (an Arena log, a failed reply). The rest is exported as
    this app's `side_a/b` and not used by the fit.
    """

    backend: str
    reply: str = ""
    tokens: int | None = None
    markdown: MarkdownCounts = field(default_factory=MarkdownCounts)
    first_token_s: float | None = None
    decode_tokens_per_s: float | None = None
    column: str | None = None
    label: str | None = None
    model: str | None = None
    status: str | None = None
    total_s: float | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    judged: str | None = None


@dataclass(frozen=True)
class Battle:
    """One pairwise result of a voted round (Arena's unit), with the round's context."""

    round_id: str
    a: Side
    b: Side
    winner: str  # one of WINNERS
    anony: bool = True
    rated: bool = True
    unrated_reason: str | None = None
    reveal: str | None = None
    speed_seen: bool = False  # stopped early, partial texts shown at once: speed seen whatever the reveal
    category: str = FREE_CATEGORY
    language: str = "en"
    prompt: str = ""
    judge: str | None = None
    tstamp: float | None = None
    comment: str = ""

    def __post_init__(self) -> None:
        if self.winner not in WINNERS:
            raise ValueError(f"Battle winner {self.winner!r} is not one of {', '.join(WINNERS)}.")
        if self.a.backend == self.b.backend:
            raise ValueError(f"A battle needs two different backends, got {self.a.backend!r} twice.")

    @property
    def counted(self) -> bool:
        """Whether the ratings count it: blind, and not set apart (e.g. its comment named a backend)."""
        return self.anony and self.rated

    @property
    def speed_shown(self) -> bool:
        """Whether the voter saw each side's speed before voting (core.ratings.controlled)."""
        return self.reveal in SPEED_SHOWN_IN or self.speed_seen

    @property
    def score_a(self) -> float:
        """What side a scored: 1 won, 0 lost, 0.5 tie or both bad."""
        return {"model_a": 1.0, "model_b": 0.0}.get(self.winner, 0.5)


# ---------------------------------------------------------------- from stored votes


def battles_from_vote(record: VoteRecord, catalogue: PromptCatalogue) -> list[Battle]:
    """The pairwise battles of one stored vote, in column order, each side with its reply's text
    and figures (`record` read with its replies)."""
    vote = record.vote
    replies = record.replies or (None,) * len(record.columns)
    category, language = catalogue.classify(record.prompt)
    sides = []
    for column, reply in zip(record.columns, replies):
        text = reply.reply_text if reply else ""
        sides.append(Side(
            backend=column.backend, reply=text, tokens=reply.output_tokens if reply else None,
            markdown=markdown_counts(text),
            first_token_s=reply.first_token_s if reply else None,
            decode_tokens_per_s=reply.decode_tokens_per_s if reply else None,
            column=column.label, label=reply.backend_label if reply else None, model=reply.model if reply else None,
            status=reply.status if reply else None, total_s=reply.total_s if reply else None,
            settings=reply.settings_sent if reply else {}, judged=vote.judgements.get(column.label),
        ))
    context = dict(round_id=vote.round_id, anony=record.mode == "blind", rated=vote.unrated_reason is None,
                   unrated_reason=vote.unrated_reason, reveal=record.reveal, speed_seen=record.speed_seen,
                   category=category, language=language,
                   prompt=record.prompt, judge=vote.user_identifier, tstamp=vote.created_at.timestamp(),
                   comment=vote.comment)
    if vote.outcome == "win":
        won = [column.label for column in record.columns].index(vote.winner_label)
        battles = []
        for other in range(len(sides)):
            if other != won:
                first, second = sorted((won, other))
                battles.append(Battle(a=sides[first], b=sides[second],
                                      winner="model_a" if first == won else "model_b", **context))
        return battles
    tie = "tie" if vote.outcome == "tie" else "tie (bothbad)"
    return [Battle(a=sides[i], b=sides[j], winner=tie, **context)
            for i in range(len(sides)) for j in range(i + 1, len(sides))]


def battles_from_votes(records: Iterable[VoteRecord], catalogue: PromptCatalogue) -> list[Battle]:
    """Every stored vote's battles, in vote order."""
    return [battle for record in records for battle in battles_from_vote(record, catalogue)]


# ---------------------------------------------------------------- back to rounds


def rounds_from_battles(battles: Iterable[Battle]) -> list[RoundVote]:
    """The voted rounds the battles came from, in order of first appearance, for the plain
    ratings and the round-level counts. Raises ValueError for a round whose lines cannot come
    from one vote (two winners, a win mixed with ties)."""
    grouped: dict[str, list[Battle]] = {}
    for battle in battles:
        grouped.setdefault(battle.round_id, []).append(battle)
    return [_round_vote(round_id, group) for round_id, group in grouped.items()]


def _round_vote(round_id: str, group: Sequence[Battle]) -> RoundVote:
    sides: dict[str, Side] = {}
    for battle in group:
        for side in (battle.a, battle.b):
            sides.setdefault(side.backend, side)
    # Column order where the columns are known (this app's export), else order of appearance.
    ordered = sorted(sides.values(), key=lambda side: (side.column is None, side.column or ""))
    backends = tuple(side.backend for side in ordered)
    winners = {battle.a.backend if battle.winner == "model_a" else battle.b.backend
               for battle in group if battle.winner in ("model_a", "model_b")}
    kinds = {battle.winner for battle in group if battle.winner not in ("model_a", "model_b")}
    if len(winners) > 1 or (winners and kinds) or len(kinds) > 1:
        raise ValueError(f"Round {round_id} mixes results that one vote cannot give "
                         f"({', '.join(sorted(b.winner for b in group))}): give each battle its own round_id.")
    if winners:
        outcome, winner = "win", next(iter(winners))
    else:
        outcome, winner = ("tie" if kinds == {"tie"} else "both_bad"), None
    verdicts = tuple(side.judged for side in ordered) if any(side.judged for side in ordered) else ()
    return RoundVote(backends=backends, outcome=outcome, winner=winner, verdicts=verdicts, comment=group[0].comment)


# ---------------------------------------------------------------- views


@dataclass(frozen=True)
class BattleView:
    """Which battles a leaderboard shows: one category and/or one language, or all (None)."""

    category: str | None = None
    language: str | None = None

    def admits(self, battle: Battle) -> bool:
        return ((self.category is None or battle.category == self.category)
                and (self.language is None or battle.language == self.language))

    def select(self, battles: Iterable[Battle]) -> list[Battle]:
        return [battle for battle in battles if self.admits(battle)]


def votes_by(battles: Iterable[Battle], key: str) -> list[tuple[str, int]]:
    """How many votes (rounds) each value of `key` ("category" or "language") holds, most first."""
    rounds = {battle.round_id: getattr(battle, key) for battle in battles}
    return sorted(Counter(rounds.values()).items(), key=lambda item: (-item[1], item[0]))


def vote_count(battles: Iterable[Battle]) -> int:
    """Votes (rounds) among the battles."""
    return len({battle.round_id for battle in battles})


# ---------------------------------------------------------------- JSON lines


def battle_to_json(battle: Battle) -> dict[str, Any]:
    """One battle as its JSON object (see the module's field table)."""
    a, b = battle.a, battle.b
    return {
        "round_id": battle.round_id,
        "model_a": a.backend,
        "model_b": b.backend,
        "winner": battle.winner,
        "judge": battle.judge,
        "anony": battle.anony,
        "tstamp": battle.tstamp,
        "language": battle.language,
        "category": battle.category,
        "conversation_a": _conversation(battle.prompt, a.reply),
        "conversation_b": _conversation(battle.prompt, b.reply),
        "conv_metadata": {**_metadata(a, "a"), **_metadata(b, "b")},
        "reveal": battle.reveal,
        "speed_seen": battle.speed_seen,
        "side_a": _side_figures(a),
        "side_b": _side_figures(b),
        "comment": battle.comment,
        "rated": battle.rated,
        "unrated_reason": battle.unrated_reason,
    }


def write_battles(battles: Iterable[Battle], stream: TextIO) -> int:
    """Write one JSON line per battle (UTF-8 text as is); returns how many."""
    count = 0
    for battle in battles:
        stream.write(json.dumps(battle_to_json(battle), ensure_ascii=False) + "\n")
        count += 1
    return count


def battles_jsonl(battles: Iterable[Battle]) -> bytes:
    """The battles as a JSONL file's bytes (for a download)."""
    return "".join(json.dumps(battle_to_json(b), ensure_ascii=False) + "\n" for b in battles).encode("utf-8")


def read_battles(path: str | Path) -> list[Battle]:
    """Read a battle file (this app's export or a converted Arena log); blank lines are skipped.
    Raises BattleFileError naming the line and what is wrong."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise BattleFileError(f"Cannot read the battle file {path}: {error.strerror}.") from error
    battles = []
    # Line by line, so that a broken character is reported with its line; "utf-8-sig" lets a
    # file saved with a byte-order mark (some Windows editors) load.
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            if line.strip():
                battles.append(battle_from_json(json.loads(line)))
        except UnicodeDecodeError as error:
            raise BattleFileError(f"{path}, line {number}: not UTF-8 text (byte {error.start}): "
                                  "save the file as UTF-8.") from error
        except json.JSONDecodeError as error:
            raise BattleFileError(f"{path}, line {number}: not valid JSON ({error.msg}, column {error.colno}).") from error
        except (ValueError, TypeError, KeyError) as error:
            raise BattleFileError(f"{path}, line {number}: {error}") from error
    if not battles:
        raise BattleFileError(f"{path} holds no battles: write one JSON object per line (see core/ratings/battles.py).")
    try:
        rounds_from_battles(battles)
    except ValueError as error:
        raise BattleFileError(f"{path}: {error}") from error
    return battles


def battle_from_json(record: Any) -> Battle:
    """One JSON object as a Battle; a missing or mistyped field raises ValueError saying which."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    for name in ("round_id", "model_a", "model_b", "winner"):
        if not isinstance(record.get(name), str) or not record[name]:
            raise ValueError(f'"{name}" must be a non-empty string')
    if record["winner"] not in WINNERS:
        raise ValueError(f'"winner" is {record["winner"]!r}; expected one of {", ".join(WINNERS)}')
    metadata = record.get("conv_metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError('"conv_metadata" must be an object')
    return Battle(
        round_id=record["round_id"],
        a=_side_from_json(record, "a", metadata),
        b=_side_from_json(record, "b", metadata),
        winner=record["winner"],
        anony=bool(record.get("anony", True)),
        rated=bool(record.get("rated", True)),
        unrated_reason=record.get("unrated_reason"),
        reveal=record.get("reveal"),
        speed_seen=bool(record.get("speed_seen", False)),
        category=str(record.get("category") or FREE_CATEGORY),
        language=str(record.get("language") or script_language(_prompt_of(record.get("conversation_a")))),
        prompt=_prompt_of(record.get("conversation_a")),
        judge=record.get("judge"),
        tstamp=_number_or_none(record.get("tstamp"), "tstamp"),
        comment=str(record.get("comment") or ""),
    )


def _conversation(prompt: str, reply: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


def _metadata(side: Side, suffix: str) -> dict[str, Any]:
    return {
        f"sum_assistant_{suffix}_tokens": side.tokens,
        f"header_count_{suffix}": dict(side.markdown.headers),
        f"list_count_{suffix}": dict(side.markdown.lists),
        f"bold_count_{suffix}": dict(side.markdown.bold),
    }


def _side_figures(side: Side) -> dict[str, Any]:
    return {"column": side.column, "label": side.label, "model": side.model, "status": side.status,
            "first_token_s": side.first_token_s, "decode_tokens_per_s": side.decode_tokens_per_s,
            "total_s": side.total_s, "settings": dict(side.settings), "judged": side.judged}


def _side_from_json(record: dict, suffix: str, metadata: dict) -> Side:
    figures = record.get(f"side_{suffix}") or {}
    if not isinstance(figures, dict):
        raise ValueError(f'"side_{suffix}" must be an object')
    reply = _reply_of(record.get(f"conversation_{suffix}"))
    counted = markdown_counts(reply)  # where the log gives no counts, count them in the text
    tokens = metadata.get(f"sum_assistant_{suffix}_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise ValueError(f'"sum_assistant_{suffix}_tokens" must be a whole number of 0 or more, got {tokens!r}')
    return Side(
        backend=record[f"model_{suffix}"],
        reply=reply,
        tokens=tokens,
        markdown=MarkdownCounts(
            headers=_counts(metadata.get(f"header_count_{suffix}"), counted.headers, f"header_count_{suffix}"),
            lists=_counts(metadata.get(f"list_count_{suffix}"), counted.lists, f"list_count_{suffix}"),
            bold=_counts(metadata.get(f"bold_count_{suffix}"), counted.bold, f"bold_count_{suffix}"),
        ),
        first_token_s=_number_or_none(figures.get("first_token_s"), f"side_{suffix}.first_token_s"),
        decode_tokens_per_s=_number_or_none(figures.get("decode_tokens_per_s"), f"side_{suffix}.decode_tokens_per_s"),
        column=figures.get("column"),
        label=figures.get("label"),
        model=figures.get("model"),
        status=figures.get("status"),
        total_s=_number_or_none(figures.get("total_s"), f"side_{suffix}.total_s"),
        settings=figures.get("settings") or {},
        judged=figures.get("judged"),
    )


def _counts(value: Any, counted: Mapping[str, int], name: str) -> Mapping[str, int]:
    """Counts by kind as the log gives them: an object of whole numbers, or one total (older
    Arena logs), or nothing (then counted in the text)."""
    if value is None:
        return counted
    if isinstance(value, int) and not isinstance(value, bool):
        return {"total": value}
    if isinstance(value, dict) and all(isinstance(n, int) and not isinstance(n, bool) for n in value.values()):
        return dict(value)
    raise ValueError(f'"{name}" must be an object of whole numbers or one whole number, got {value!r}')


def _number_or_none(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'"{name}" must be a number or null, got {value!r}')
    return float(value)


def _message_text(content: Any) -> str:
    """A message's text: a string, or Arena's newer list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def _turns(conversation: Any, role: str) -> list[str]:
    if not isinstance(conversation, list):
        return []
    return [_message_text(message.get("content")) for message in conversation
            if isinstance(message, dict) and message.get("role") == role]


def _prompt_of(conversation: Any) -> str:
    """The first user message (the prompt the battle started from)."""
    users = _turns(conversation, "user")
    return users[0] if users else ""


def _reply_of(conversation: Any) -> str:
    """Every assistant message of the conversation, joined (a multi-turn battle is judged whole)."""
    return "\n\n".join(_turns(conversation, "assistant"))
