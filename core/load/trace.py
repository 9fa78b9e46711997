"""A class's traffic as a trace: every request's time, student, conversation, prompt and output lengths,
and which prompt blocks it shares with others - and sending that traffic to an engine again.

One JSON object a line (`TraceRequest.as_json`), in the shape AIPerf's `mooncake_trace` loader reads
where the fields overlap:

    timestamp      ms from the trace's first request                       (AIPerf: the same)
    session_id     the conversation (its turns are sent in order)          (AIPerf: the same)
    output_length  the reply's tokens: the replay asks for exactly that    (AIPerf: max tokens)
    input_length   the prompt's tokens, and                                (AIPerf: the same; only in a
    hash_ids       Mooncake block hash ids of the prompt                    trace without the texts)
    messages       the exact messages sent (with the texts)                (AIPerf: the same, verbatim)
    serving_lab    ours: {user, turn, input_length, hash_ids, block_size, tokenizer, backend, ttft_ms,
                   duration_ms, cached_tokens} - the structure is here in both kinds of trace

AIPerf takes either `messages` or `input_length`/`hash_ids`, never both, so a trace with the texts
carries them as `messages` and keeps the lengths and blocks under `serving_lab`; AIPerf ignores
fields it does not know. Replay a trace with `aiperf profile --input-file T --custom-dataset-type
mooncake_trace --fixed-schedule --isl-block-size 32` (a trace without texts) or `python -m bench
replay T`.

Prompt lengths and blocks are counted with one tokenizer, the bundled SmolLM2's chat template and
vocabulary (`backends.llamacpp.PromptTokenizer`), whatever engine answered: a trace describes the
class, not an engine. Blocks are `BLOCK_SIZE` tokens; a block's hash id stands for it and every
block before it (Mooncake's chained hashes), numbered from 0 in order of first appearance, so two
prompts share their leading hash ids exactly as far as they share a prefix: the class's system
prompt, a conversation's earlier turns.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from backends.base import ChatMessage
from store import StoredReply

BLOCK_SIZE = 32  # tokens a block (vLLM's on these CPUs, scripts/vllm_launch.py); AIPerf: --isl-block-size 32
TOKENIZER = "SmolLM2-135M-Instruct (the bundled GGUF's chat template and vocabulary)"
CLASS_GAP_S = 30 * 60  # a quiet half hour ends a class session
TRACE_MODES = ("chat", "compare", "blind")  # a student's message; replays and load runs are not class traffic
ROLES = ("system", "user", "assistant")


class TraceError(ValueError):
    """A trace line that cannot be read: the message names the line and what is wrong."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a class: when, who, which conversation and turn, how long its prompt and reply."""

    timestamp_ms: float
    session_id: str
    user: str
    turn: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    messages: tuple[ChatMessage, ...] | None = None  # None: the texts were left out
    backend: str | None = None  # the engine that answered in class
    ttft_ms: float | None = None  # its time to first token in class
    cached_tokens: int | None = None  # prompt tokens its engine took from its cache (None: not reported)
    block_size: int = BLOCK_SIZE
    duration_ms: float | None = None  # from sending it to the reply's end, in class

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"timestamp": round(self.timestamp_ms, 3), "session_id": self.session_id,
                                "output_length": self.output_length}
        if self.messages is None:
            data |= {"input_length": self.input_length, "hash_ids": list(self.hash_ids)}
        else:
            data["messages"] = [message.as_dict() for message in self.messages]
        data["serving_lab"] = {"user": self.user, "turn": self.turn, "input_length": self.input_length,
                               "hash_ids": list(self.hash_ids), "block_size": self.block_size,
                               "tokenizer": TOKENIZER, "backend": self.backend, "ttft_ms": self.ttft_ms,
                               "duration_ms": self.duration_ms, "cached_tokens": self.cached_tokens}
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> "TraceRequest":
        """Read one line (ours, or a plain Mooncake/AIPerf line with input_length and hash_ids)."""
        def fail(problem: str) -> TraceError:
            return TraceError(f"{where}: {problem}")

        if not isinstance(data, dict):
            raise fail("not a JSON object")
        ours = data.get("serving_lab") if isinstance(data.get("serving_lab"), dict) else {}
        timestamp = data.get("timestamp")
        output_length = data.get("output_length")
        input_length = data.get("input_length", ours.get("input_length"))
        hash_ids = data.get("hash_ids", ours.get("hash_ids")) or []
        if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool) or timestamp < 0:
            raise fail('needs a "timestamp" in ms, 0 or more')
        if not isinstance(output_length, int) or isinstance(output_length, bool) or output_length < 1:
            raise fail('needs an "output_length" of at least 1 token')
        messages = None
        if "messages" in data:
            raw = data["messages"]
            if not isinstance(raw, list) or not raw or not all(
                    isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in raw):
                raise fail('"messages" must be a list of {"role", "content"} objects')
            messages = tuple(ChatMessage(m["role"], m["content"]) for m in raw)
        elif not isinstance(input_length, int) or isinstance(input_length, bool) or input_length < 1:
            raise fail('needs "messages" or an "input_length" of at least 1 token')
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids):
            raise fail('"hash_ids" must be a list of whole numbers')
        return cls(timestamp_ms=float(timestamp), session_id=str(data.get("session_id") or f"line-{where}"),
                   user=str(ours.get("user") or data.get("session_id") or where), turn=int(ours.get("turn") or 0),
                   input_length=int(input_length or 0), output_length=output_length, hash_ids=tuple(hash_ids),
                   messages=messages, backend=ours.get("backend"), ttft_ms=ours.get("ttft_ms"),
                   cached_tokens=ours.get("cached_tokens"), block_size=int(ours.get("block_size") or BLOCK_SIZE),
                   duration_ms=ours.get("duration_ms"))


# ---------------------------------------------------------------- blocks


class BlockHasher:
    """Mooncake-style hash ids: a block's id stands for its tokens and every block before it."""

    def __init__(self, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._ids: dict[bytes, int] = {}

    def hash_ids(self, tokens: Sequence[int]) -> tuple[int, ...]:
        ids, chain = [], b""
        for start in range(0, len(tokens), self.block_size):
            block = ",".join(str(t) for t in tokens[start:start + self.block_size]).encode()
            chain = hashlib.sha256(chain + b"|" + block).digest()
            ids.append(self._ids.setdefault(chain, len(self._ids)))
        return tuple(ids)


# ---------------------------------------------------------------- from the app's stored replies


def class_session(replies: Sequence[StoredReply], gap_s: float = CLASS_GAP_S) -> list[StoredReply]:
    """The latest class session: the newest class replies back to the first quiet gap of `gap_s`."""
    ordered = sorted((r for r in replies if r.mode in TRACE_MODES), key=_started_at)
    if not ordered:
        return []
    first = len(ordered) - 1
    while first > 0 and _started_at(ordered[first]) - _ended_at(ordered[first - 1]) < gap_s:
        first -= 1
    return ordered[first:]


def _started_at(reply: StoredReply) -> float:
    started = (reply.record or {}).get("started_at_unix_s")
    return float(started) if isinstance(started, (int, float)) and started > 0 else \
        reply.created_at.timestamp() - reply.total_s


def _ended_at(reply: StoredReply) -> float:
    return _started_at(reply) + reply.total_s


def trace_from_replies(replies: Sequence[StoredReply], tokens: Callable[[Sequence[ChatMessage]], list[int]], *,
                       texts: bool = True, block_size: int = BLOCK_SIZE) -> list[TraceRequest]:
    """A trace of these replies (a class session): one request per student message (a compare or blind
    round's message once, as its first column sent it), students and conversations numbered in order
    of appearance, never named. Each request's messages are rebuilt from the stored thread: the system
    prompt and the number of messages it sent (stored with the reply), the thread's earlier messages
    and the replies kept in it. `tokens` templates and tokenizes a conversation (`PromptTokenizer`)."""
    kept = [r for r in sorted(replies, key=_started_at) if r.mode in TRACE_MODES]
    first_columns: dict[str, StoredReply] = {}
    for reply in kept:
        if reply.round_id is not None:
            current = first_columns.get(reply.round_id)
            if current is None or (reply.column_label or "") < (current.column_label or ""):
                first_columns[reply.round_id] = reply
    chosen = [r for r in kept if r.round_id is None or first_columns[r.round_id] is r]
    if not chosen:
        return []
    users: dict[str | None, str] = {}
    sessions: dict[str, str] = {}
    history: dict[tuple[str, str | None], list[ChatMessage]] = {}
    turns: dict[str, int] = {}
    hasher = BlockHasher(block_size)
    start_s = _started_at(chosen[0])
    trace = []
    for reply in chosen:
        thread = reply.thread_id or reply.id
        lane = (thread, reply.column_label)  # a round's column keeps its own conversation
        shape = (reply.record or {}).get("request") or {}
        earlier = history.setdefault(lane, [])
        sent = int(shape.get("messages") or 0)
        system = shape.get("system_prompt")
        room = max(sent - 1 - (1 if system else 0), 0) if sent else len(earlier)
        messages = ([ChatMessage("system", system)] if system else []) + (earlier[-room:] if room else []) + [
            ChatMessage("user", reply.prompt)]
        token_ids = tokens(messages)
        turns[thread] = turns.get(thread, 0) + 1
        server = (reply.record or {}).get("server") or {}
        trace.append(TraceRequest(
            timestamp_ms=(_started_at(reply) - start_s) * 1000.0,
            session_id=sessions.setdefault(thread, f"c{len(sessions) + 1}"),
            user=users.setdefault(reply.user_identifier, f"s{len(users) + 1}"),
            turn=turns[thread], input_length=len(token_ids), output_length=max(reply.output_tokens, 1),
            hash_ids=hasher.hash_ids(token_ids), messages=tuple(messages) if texts else None,
            backend=reply.backend_label, ttft_ms=None if reply.first_token_s is None else round(reply.first_token_s * 1000, 1),
            cached_tokens=server.get("cached_prompt_tokens"), block_size=block_size,
            duration_ms=round(reply.total_s * 1000, 1)))
        if reply.status != "error" or reply.reply_text:  # what the chat kept in the conversation
            earlier += [ChatMessage("user", reply.prompt), ChatMessage("assistant", reply.reply_text)]
    return trace


# ---------------------------------------------------------------- files


def trace_jsonl(trace: Iterable[TraceRequest]) -> bytes:
    return "".join(json.dumps(r.as_json(), ensure_ascii=False) + "\n" for r in trace).encode("utf-8")


def read_trace(path: str | Path) -> list[TraceRequest]:
    """A trace file (ours or a plain Mooncake/AIPerf one). Raises TraceError naming the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except OSError as error:
        raise TraceError(f"cannot read the trace {path}: {error.strerror}") from error
    trace = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}, line {number}: not valid JSON ({error.msg})") from error
        trace.append(TraceRequest.from_json(data, f"{path.name}:{number}"))
    if not trace:
        raise TraceError(f"{path} holds no requests")
    return sorted(numbered_turns(trace), key=lambda r: r.timestamp_ms)


def numbered_turns(trace: Sequence[TraceRequest]) -> list[TraceRequest]:
    """Each request whose line names no turn (a plain Mooncake/AIPerf trace) becomes its
    conversation's n-th turn, n its place among the conversation's lines in the file."""
    seen: dict[str, int] = {}
    numbered = []
    for request in trace:
        seen[request.session_id] = seen.get(request.session_id, 0) + 1
        numbered.append(request if request.turn >= 1 else replace(request, turn=seen[request.session_id]))
    return numbered


# ---------------------------------------------------------------- what the class looked like


@dataclass(frozen=True)
class ClassShape:
    """Who and how much: students, messages, conversations, the most requests in flight at once."""

    students: int
    messages: int
    conversations: int
    most_at_once: int | None  # None: not recorded (the trace holds no request's span in class)
    duration_s: float


def class_shape(trace: Sequence[TraceRequest], ends_ms: Sequence[float] | None = None) -> ClassShape:
    """The class's size; `most_at_once` from each request's span in class (its timestamp to its end in
    `ends_ms`, else to its timestamp plus its duration in class, else its TTFT); None where the trace
    records none of these (a plain Mooncake/AIPerf trace): not 0."""
    recorded = ends_ms is not None or any(r.duration_ms is not None or r.ttft_ms is not None for r in trace)
    events = []
    for index, request in enumerate(trace):
        span = request.duration_ms if request.duration_ms is not None else (request.ttft_ms or 0.0)
        end = ends_ms[index] if ends_ms is not None else request.timestamp_ms + span
        events += [(request.timestamp_ms, 1), (max(end, request.timestamp_ms), -1)]
    running = most = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        running += change
        most = max(most, running)
    return ClassShape(students=len({r.user for r in trace}), messages=len(trace),
                      conversations=len({r.session_id for r in trace}), most_at_once=most if recorded else None,
                      duration_s=(max((r.timestamp_ms for r in trace), default=0.0)) / 1000.0)


# ---------------------------------------------------------------- scaling


def scaled(trace: Sequence[TraceRequest], *, speed: float = 1.0, users: float = 1.0, seed: int = 0,
           shift_s: float = 30.0) -> list[TraceRequest]:
    """The trace at `speed` times its pace (its timestamps divided) and with `users` times the
    students. Each added copy of a student's conversations is the same conversations started at a
    seeded random shift within +-`shift_s` seconds (at 0 or later); a copy's messages are marked
    "(2) " ... so that it shares the class's system prompt but not another student's questions,
    and its blocks get new hash ids beyond those the class shared."""
    if speed <= 0 or users <= 0:
        raise ValueError("speed and users must be above 0")
    copies = int(users) + (1 if users % 1 else 0)
    shared = _shared_hash_ids(trace)
    top = max((h for r in trace for h in r.hash_ids), default=-1) + 1
    sessions = sorted({r.session_id for r in trace})
    generator = random.Random(seed)
    out = []
    for copy in range(copies):
        chosen = sessions if copy < int(users) else \
            sorted(generator.sample(sessions, round(len(sessions) * (users % 1)) or 1))
        shift_ms = {s: 0.0 if copy == 0 else generator.uniform(-shift_s, shift_s) * 1000 for s in chosen}
        for request in trace:
            if request.session_id not in shift_ms:
                continue
            if copy == 0:
                out.append(replace(request, timestamp_ms=request.timestamp_ms / speed))
                continue
            out.append(replace(
                request, timestamp_ms=max(request.timestamp_ms + shift_ms[request.session_id], 0.0) / speed,
                session_id=f"{request.session_id}x{copy + 1}", user=f"{request.user}x{copy + 1}",
                hash_ids=tuple(h if h in shared else h + top * copy for h in request.hash_ids),
                messages=None if request.messages is None else tuple(
                    ChatMessage(m.role, f"({copy + 1}) {m.content}") if m.role == "user" else m
                    for m in request.messages)))
    return sorted(out, key=lambda r: r.timestamp_ms)


def _shared_hash_ids(trace: Sequence[TraceRequest]) -> set[int]:
    """Hash ids that appear in more than one conversation (the class's system prompt)."""
    seen: dict[int, str] = {}
    shared = set()
    for request in trace:
        for h in request.hash_ids:
            if seen.setdefault(h, request.session_id) != request.session_id:
                shared.add(h)
    return shared


def busiest_window(trace: Sequence[TraceRequest], window_s: float) -> list[TraceRequest]:
    """The `window_s` of the trace with the most requests, re-based to start at 0 (whole conversations
    are not kept together: a request keeps its own messages)."""
    if not trace:
        return []
    times = [r.timestamp_ms for r in trace]
    best, best_start = 0, 0
    low = 0
    for high, end in enumerate(times):
        while end - times[low] > window_s * 1000:
            low += 1
        if high - low + 1 > best:
            best, best_start = high - low + 1, low
    chosen = trace[best_start:best_start + best]
    origin = chosen[0].timestamp_ms
    return [replace(r, timestamp_ms=r.timestamp_ms - origin) for r in chosen]


# ---------------------------------------------------------------- prompts without texts


WORDS = ("time", "token", "cache", "model", "class", "reply", "engine", "student", "answer", "question", "batch",
         "memory", "speed", "server", "prompt", "number", "system", "people", "small", "large", "first", "second",
         "every", "often", "always", "never", "simple", "clear", "short", "long", "quick", "slow")


def synthetic_messages(request: TraceRequest) -> tuple[ChatMessage, ...]:
    """A prompt for a trace without texts: each hash id becomes the same `block_size` words every time
    (seeded by the id), so requests share exactly the prefix blocks the class shared. One common word
    is about one token in most tokenizers; the engine's own count of the prompt is what the replay
    reports."""
    words: list[str] = []
    for index, hash_id in enumerate(request.hash_ids):
        generator = random.Random(hash_id)
        size = request.block_size if index < len(request.hash_ids) - 1 else \
            max(request.input_length - request.block_size * (len(request.hash_ids) - 1), 1)
        words += [generator.choice(WORDS) for _ in range(size)]
    if not request.hash_ids:
        words = [WORDS[i % len(WORDS)] for i in range(request.input_length)]
    return (ChatMessage("user", " ".join(words)),)
