"""Stream one measured reply into the UI.

Measurement stays per chunk (in `timing`); only rendering is batched:
- text goes to the browser as soon as it arrives, then at most every
  TEXT_INTERVAL_S with whatever came meanwhile (FAST_TEXT_INTERVALS_S once a
  stream outruns any reader): the first text is never held back (a class sees
  it as soon as a bare Chainlit app would show it), and a backend at thousands
  of tokens/s does not leave the browser behind; the last text is not held
  either: once the engine says the reply is finished (a chunk's finish reason),
  what is pending goes at once, before the stream is closed and measured;
- the metrics element is refreshed about every METRICS_INTERVAL_S (~10 Hz): while text is
  streaming, a refresh that is nearly due rides with the next piece of text (`CARRY_AFTER`), so a
  page that takes both in one event (ui/live_tap.py) gets one event and draws once instead of
  twice; a refresh with no text coming goes alone, on time;
- a reply's end (its final figures, then the caller's last update of the message and its rows)
  waits while other replies on this loop still have text coming, up to END_WAIT_S: a class's
  replies end within tens of ms of each other, and each end done at once held the others' last
  text back (reply end +86 / +131 ms over bare Chainlit's, p50 / p99, with 60 students at once).

`LiveReply` talks to duck-typed `message` (`stream_token`) and `metrics`
(`props`, `update`) objects, so the same code drives Chainlit and unit tests,
and one `LiveReply` drives a chat reply (compare rounds draw all their columns
as one element, core/rounds.py).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Awaitable, Callable, Protocol

from backends.base import PreparedRequest, StreamChunk
from core.figures import final_props, ignored_lines, live_props
from core.streaming import StreamOutcome, Stopped, consume
from core.timing import TimedStream

TEXT_INTERVAL_S = 0.04
# A stream faster than anyone reads is drawn less often: each drawing re-renders the whole message
# in the browser (Chainlit parses its Markdown again), and a drawing the browser is still busy with
# when the last text comes makes the last text wait. Chunks per second since the last drawing (at
# the first drawing: the pace its chunks arrived at) -> the wait before the next. At 2000 tokens/s
# drawings every 40 ms left the last token 40-100 ms behind; every 100 ms, 21-41 ms (the drawing
# 10 ms before the end of a 150 ms reply); every 200 ms, the last text is the next drawing. The
# last text still goes out at once when the stream ends.
FAST_TEXT_INTERVALS_S = ((1200.0, 0.2), (400.0, 0.1))
METRICS_INTERVAL_S = 0.1
# A piece of text drawn this far (a share of METRICS_INTERVAL_S) after the last refresh of the figures
# carries their next refresh: with text every 40 ms the figures then ride along every 80 ms, no event
# of their own. A class of 30 at 50 tokens/s got 52 text events and 24 figure events per reply, now
# 52 and 4: half the page's drawings of the figures while text streams. (The app's CPU per reply did
# not change measurably: an emit is cheap next to the per-chunk work.)
CARRY_AFTER = 0.6
END_WAIT_S = 0.1


class TextSink(Protocol):
    async def stream_token(self, token: str, figures: "MetricsSink | None" = None) -> None:
        """Draw the next piece of text; with `figures`, also their current `props` (one event where the
        page takes both at once, else the figures' own `update()` right after the text)."""


class MetricsSink(Protocol):
    props: dict

    async def update(self) -> None: ...


class LiveReply:
    """Drives one reply: consume the timed stream, render text and figures."""

    def __init__(
        self,
        timed: TimedStream,
        message: TextSink,
        metrics: MetricsSink,
        *,
        lang: str = "en",
        request: PreparedRequest | None = None,
        engine_at_start: str | Callable[[], Awaitable[str | None]] | None = None,
        queue_shown: Callable[[], bool] | None = None,
        text_interval_s: float = TEXT_INTERVAL_S,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> None:
        self.timed = timed
        self.message = message
        self.metrics = metrics
        self.lang = lang
        self.request = request
        self.engine_at_start = engine_at_start
        # Asked at each drawing: whether a queue position may be shown (core.disclosure; None: always).
        self.queue_shown = queue_shown
        self.text_interval_s = text_interval_s
        self.metrics_interval_s = metrics_interval_s
        self._pending: list[str] = []
        self._arrivals: tuple[float | None, float | None] = (None, None)  # first, last stamp of the pending text
        self._shown: list[str] = []
        self._text_arrived = asyncio.Event()
        self._text_finished = False  # the engine said no more text follows
        self._pause: asyncio.Future | None = None  # the text loop's wait between drawings
        self._shown_first: asyncio.Task | None = None
        self._streams: TextStreams | None = None  # this loop's replies with text to come, while this one's is
        self._figures_at: float | None = None  # the loop time of the last live refresh, while they refresh

    async def run(self, shown: Awaitable[None] | None = None) -> StreamOutcome:
        """Stream to the end, a backend error, or the person's Stop (core.streaming.consume); the
        partial text of a stopped reply stays, and its figures say "stopped".

        `shown` puts the message and its figures on screen (Chainlit's sends, a database write or
        two): it runs while the request is on its way, not before it leaves, and nothing is drawn
        into the message before it has finished."""
        showing = asyncio.create_task(shown) if shown is not None else None
        self._shown_first = showing
        self._streams = text_streams()
        self._streams.opened()
        renderers = [asyncio.create_task(self._text_loop()), asyncio.create_task(self._figures_loop())]
        try:
            outcome = await consume(self.timed, on_chunk=self._take)
        except Stopped as stopped:
            outcome = stopped.outcome  # Stop ends this reply, not the chat: it is kept and stored
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # handled here on purpose: the handler goes on to store the reply
        finally:
            self._text_complete()  # however it ended (an unexpected error too): no text of this reply is to come
            self._figures_at = None  # the final figures follow the last text: no live refresh rides with it
            for renderer in renderers:
                renderer.cancel()
            if showing is not None:
                await asyncio.shield(showing)  # the message exists before its last text and figures
        await self._flush_text()
        if outcome.status == "completed":
            await self._after_other_texts()
        engine_at_start = self.engine_at_start
        if callable(engine_at_start):  # a shared reading, taken while the reply streamed
            engine_at_start = await engine_at_start()
        self.metrics.props = final_props(outcome.record, lang=self.lang, request=self.request,
                                         engine_at_start=engine_at_start)
        await self.metrics.update()
        return outcome

    def _take(self, chunk: StreamChunk) -> None:
        if chunk.text:
            self._pending.append(chunk.text)
            if chunk.arrived_at_s is not None:
                first = self._arrivals[0]
                self._arrivals = (chunk.arrived_at_s if first is None else first, chunk.arrived_at_s)
            self._text_arrived.set()
        if chunk.finish_reason is not None and not self._text_finished:
            # The reply's last text: drawn now, not at the next interval. A class's replies end
            # together, and each waiting out its interval put tens of ms on every reply's end.
            self._text_finished = True
            self._text_arrived.set()
            if self._pause is not None:
                _wake(self._pause)
            self._text_complete()

    def _text_complete(self) -> None:
        """No more text of this reply (said once)."""
        streams, self._streams = self._streams, None
        if streams is not None:
            streams.closed()

    async def _after_other_texts(self) -> None:
        """Wait (END_WAIT_S at most) until no other reply on this loop has text to come. A Stop in
        the meantime ends nothing: this reply's text is complete, and it is kept and stored."""
        try:
            await text_streams().quiet(END_WAIT_S)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()

    async def _flush_text(self) -> tuple[int, float | None]:
        """Send what came since the last drawing: how many chunks it held, and the seconds between
        the first and the last of them arriving (None unless they were stamped where they arrived)."""
        chunks = len(self._pending)
        first, last = self._arrivals
        self._arrivals = (None, None)
        if self._pending:
            batch = "".join(self._pending)
            self._pending.clear()
            self._shown.append(batch)
            figures_at = self._figures_at
            if figures_at is not None and \
                    asyncio.get_running_loop().time() - figures_at >= CARRY_AFTER * self.metrics_interval_s:
                self._refresh_figures()
                await self.message.stream_token(batch, self.metrics)
            else:
                await self.message.stream_token(batch)
        return chunks, (last - first if first is not None and last is not None else None)

    async def _text_loop(self) -> None:
        # Text that arrives while the browser was just sent some waits one interval, with what else
        # comes meanwhile; text that arrives after a quiet interval goes at once.
        if self._shown_first is not None:
            await asyncio.shield(self._shown_first)
        loop = asyncio.get_running_loop()
        drawn_at = None
        while True:
            await self._text_arrived.wait()
            self._text_arrived.clear()
            chunks, spread_s = await self._flush_text()
            if self._text_finished:
                continue  # nothing is held once the reply's text is complete
            now, since = loop.time(), drawn_at
            drawn_at = now
            if since is not None and now > since:
                rate = chunks / (now - since)
            elif chunks > 1 and spread_s:
                # The first drawing, holding what came while the message went on screen: the pace
                # those chunks arrived at (a 5000 tokens/s reply on an engine that answers at once
                # is over before a drawing 40 ms on could tell).
                rate = (chunks - 1) / spread_s
            else:
                rate = 0.0
            await self._wait_between_drawings(text_interval(rate, self.text_interval_s))

    async def _wait_between_drawings(self, seconds: float) -> None:
        """`asyncio.sleep(seconds)`, cut short when the reply's text is complete (`_take`)."""
        loop = asyncio.get_running_loop()
        self._pause = pause = loop.create_future()
        timer = loop.call_later(seconds, _wake, pause)
        try:
            await pause
        finally:
            timer.cancel()

    async def _figures_loop(self) -> None:
        # The first drawing waits one interval: the request leaves (and its clock starts) first,
        # so no drawing of ours can sit between the clock starting and the request leaving (the
        # figures already show "starting" from the message's first send).
        if self._shown_first is not None:
            await asyncio.shield(self._shown_first)
        loop = asyncio.get_running_loop()
        self._figures_at = loop.time()
        while True:
            # Due an interval after the last refresh, whether it went alone or with text (`_flush_text`).
            wait_s = self._figures_at + self.metrics_interval_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                continue
            self._refresh_figures()
            await self.metrics.update()

    def _refresh_figures(self) -> None:
        """The figures' live props now (sent by the caller)."""
        self._figures_at = asyncio.get_running_loop().time()
        self.metrics.props = live_props(
            self.timed.live(), backend=self.timed.backend, model=self.timed.model, lang=self.lang,
            ignored=ignored_lines(self.request),
            queue_shown=self.queue_shown is None or self.queue_shown(),
        )


def text_interval(chunks_per_s: float, interval_s: float = TEXT_INTERVAL_S) -> float:
    """The wait after a drawing, for a stream that came at `chunks_per_s` since the drawing before."""
    for rate, wait_s in FAST_TEXT_INTERVALS_S:
        if chunks_per_s >= rate:
            return max(wait_s, interval_s)
    return interval_s


class TextStreams:
    """The replies on one event loop whose text is still coming, and reply ends waiting for them."""

    def __init__(self) -> None:
        self.open = 0
        self._waiters: list[asyncio.Future] = []

    def opened(self) -> None:
        self.open += 1

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                _wake(waiter)

    async def quiet(self, timeout_s: float) -> None:
        """Return once no reply's text is coming, or after `timeout_s`."""
        if self.open <= 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


_text_streams: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TextStreams]" = weakref.WeakKeyDictionary()


def text_streams() -> TextStreams:
    """The running loop's `TextStreams` (Chainlit serves every session on one loop)."""
    loop = asyncio.get_running_loop()
    streams = _text_streams.get(loop)
    if streams is None:
        streams = _text_streams[loop] = TextStreams()
    return streams


def _wake(pause: asyncio.Future) -> None:
    if not pause.done():
        pause.set_result(None)
