"""A reply's figures as the browser shows them (public/elements/Metrics.jsx): data, no Chainlit.

`live_props` while the reply streams (small: sent ~10 times a second), `final_props` once it
has ended (with its timeline), `initial_props` before the request leaves. Times in ms,
rates rounded; None = not reported.
"""

from __future__ import annotations

from backends.base import PreparedRequest, ServerFigures
from core.timing import LiveFigures, RequestRecord


def _ms(seconds: float | None, digits: int = 1) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, digits)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def ignored_lines(request: PreparedRequest | None) -> list[str]:
    """'top-k is not supported by ...: ignored', one per setting the engine cannot honour."""
    return [] if request is None else [ignored.describe() for ignored in request.ignored]


def initial_props(*, backend: str, model: str, request: PreparedRequest | None, lang: str) -> dict:
    """Props before the request leaves: who answers, and what they will ignore (shown at once)."""
    return {"state": "starting", "lang": lang, "backend": backend, "model": model,
            "ignored": ignored_lines(request)}


def prompt_props(server: ServerFigures | None) -> dict | None:
    """What the reply's prompt cost, as the engine reported it: prompt tokens, how many came from its
    cache, and the prefill speed over the ones it computed (None in a field: not reported; None in
    all: the engine said nothing about the prompt)."""
    if server is None or (server.input_tokens is None and server.cached_prompt_tokens is None
                          and server.prompt_tokens_per_s is None):
        return None
    return {"tokens": server.input_tokens, "cached": server.cached_prompt_tokens,
            "computed": server.computed_prompt_tokens,
            "prefillTokensPerS": _round(server.prompt_tokens_per_s), "source": server.source}


def live_props(figures: LiveFigures, *, backend: str, model: str, lang: str,
               ignored: list[str] | None = None, queue_shown: bool = True) -> dict:
    """Props for public/elements/Metrics.jsx while streaming (small: sent ~10 times a second).
    Without `queue_shown` (a blind round of the person waits: core.disclosure) a reply waiting in
    an engine's queue shows as being sent, not its place: the queue's length says how busy the
    engine is with the round."""
    queued = figures.queue_position if queue_shown else None
    waiting = not queue_shown and figures.first_token_s is None  # queued or not: both look the same
    return {
        "state": "queued" if queued else ("starting" if waiting else "streaming"),
        "lang": lang,
        "backend": backend,
        "model": model,
        "queuePosition": queued,
        "elapsedMs": round(figures.elapsed_s * 1000),
        "ttftMs": _ms(figures.first_token_s),
        "tokens": figures.output_tokens,
        "tokensPerS": _round(figures.decode_tokens_per_s),
        "tokensExact": figures.tokens_exact,
        "prompt": prompt_props(figures.server),
        "ignored": ignored or [],
    }


def server_props(server: ServerFigures | None) -> dict | None:
    """The server's own figures, in the UI's units (None = not reported)."""
    if server is None:
        return None
    return {
        "source": server.source,
        "outputTokens": server.output_tokens,
        "inputTokens": server.input_tokens,
        "cachedTokens": server.cached_prompt_tokens,
        "computedTokens": server.computed_prompt_tokens,
        "queueMs": _ms(server.queue_s),
        "firstTokenMs": _ms(server.first_token_s),
        "promptMs": _ms(server.prompt_s),
        "decodeMs": _ms(server.decode_s),
        "inferenceMs": _ms(server.inference_s),
        "tpotMs": _ms(server.time_per_output_token_s, 2),
        "decodeTokensPerS": _round(server.decode_tokens_per_s),
        "outputTokensPerS": _round(server.output_tokens_per_s),
        "promptTokensPerS": _round(server.prompt_tokens_per_s),
    }


def timeline_props(record: RequestRecord, request: PreparedRequest | None,
                   engine_at_start: str | None = None) -> dict:
    """The reply's timeline for the expandable details: drawn once, after the reply ends.

    Its marks: request sent (time 0: the clock starts as the prepared request
    leaves), first byte, first token (first text), end of generation, stream closed.
    """
    itl = record.itl
    return {
        "engineAtStart": engine_at_start,
        "prepareMs": _ms(request.prepare_s) if request else None,
        "requestSentMs": 0.0,
        "firstByteMs": _ms(record.first_byte_s),
        "firstTokenMs": _ms(record.first_token_s),
        "lastChunkMs": _ms(record.last_chunk_s),
        "totalMs": _ms(record.total_s),
        "chunkTimesMs": [round(t * 1000.0, 2) for t in record.chunk_times_s],
        "chunkTokens": list(record.chunk_tokens),
        "itl": None if itl is None else {
            "count": itl.count,
            "medianMs": round(itl.median_ms, 2),
            "p90Ms": round(itl.p90_ms, 2),
            "p99Ms": round(itl.p99_ms, 2),
            "maxMs": round(itl.max_ms, 2),
            "stallAfterTokens": itl.longest_stall_after_tokens,
            "stallEndedMs": _ms(itl.longest_stall_ended_s),
        },
        "server": server_props(record.server),
        "sent": dict(request.sent) if request else {},
        "notes": list(request.notes) if request else [],
    }


def final_props(record: RequestRecord, *, lang: str, request: PreparedRequest | None = None,
                engine_at_start: str | None = None) -> dict:
    """Props for the frozen figures once the reply has ended, with its timeline."""
    return {
        "state": record.status,
        "lang": lang,
        "backend": record.backend,
        "model": record.model,
        "queuePosition": None,
        "elapsedMs": round(record.total_s * 1000),
        "ttftMs": _ms(record.first_token_s),
        "tokens": record.output_tokens,
        "tokensPerS": _round(record.decode_tokens_per_s),
        "msPerToken": _round(record.ms_per_output_token, 2),
        "finishReason": record.finish_reason,
        "tokensExact": record.tokens_exact,
        "tokenSource": record.token_source,
        "serverTokens": record.server_output_tokens,
        "prompt": prompt_props(record.server),
        "disagreement": record.count_disagreement,
        "ignored": ignored_lines(request),
        "timeline": timeline_props(record, request, engine_at_start),
    }
