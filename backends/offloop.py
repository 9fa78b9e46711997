"""Remote backends talk on a loop of their own, so a busy app cannot add its delay to an engine's figure.

Chainlit serves every session on one asyncio loop. When a class sends at once, that loop is busy
(sockets, the database, drawing), and a chunk that reached the app waits until the loop gets to it:
a time taken then charges the app's own queueing to the engine (measured: TTFT shown +350 ms over
the truth at p99 with 30 students at once). So every call to a remote backend runs on one other
asyncio loop, in one daemon thread per process (`IoLoop`): its requests leave there and its chunks
arrive there, and each chunk is stamped where it arrived (`StreamChunk.arrived_at_s`,
`time.perf_counter`), the first one also with when its request left (`request_sent_at_s`), before
it is handed to the app's loop. core.timing measures by those stamps.

When a request left is taken just before its first byte is written to the socket: the HTTP clients of
the remote kinds trace their requests (`trace_requests`, httpcore's own trace extension) and the
pump reads the stamp of its stream's request (a context variable). Building the request (the SDK's
options, headers, JSON) happens before, on the app's side of the measurement, as the paced test
server showed: with 60 requests at once, building them put +45 ms of the app into the TTFT.

Handing a chunk over wakes the app's loop; a chunk in the middle of a reply may wait up to
HANDOFF_WINDOW_S (10 ms) for others to share that wake-up (`Doorbell`), the first text and the
reply's end never do.

That thread needs the interpreter's lock only to read and parse, so its stamps can be late by the
interpreter's switch interval while the app's thread runs Python, not by the app's backlog.

`OffLoopBackend` wraps a backend so that this holds for every call: each coroutine method runs on
that loop (the backend's HTTP clients and their pools are made and used there only), its `stream()`
is pumped there (`OffLoopStream`), and everything else (name, label, limits, plain methods) is the
backend's own. Closing the stream on the app's side (Stop) cancels the pump and closes the
backend's stream on its loop, and waits until it is closed, as closing the backend's own stream does.
The embedded engine (in process) is not wrapped: its worker thread stamps its chunks itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import sys
import threading
import time
import weakref
from collections import deque
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Coroutine

from backends.base import PreparedRequest, StreamChunk

THREAD_NAME = "lab-backend-io"
SWITCH_INTERVAL_S = 0.001


class IoLoop:
    """One asyncio loop in a daemon thread, started on first use, shared by every remote backend."""

    def __init__(self, name: str = THREAD_NAME) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                threading.Thread(target=run, name=self.name, daemon=True).start()
                started.wait()
                self._loop = loop
                # A thread that waits on sockets gets the interpreter back within this long of asking,
                # not the default 5 ms (each wait would add it to a stamp while the app's thread runs).
                sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            return self._loop

    def submit(self, coroutine: Coroutine) -> concurrent.futures.Future:
        """Run `coroutine` on this loop; its concurrent future (cancelling it cancels the task there)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def call(self, coroutine: Coroutine) -> Any:
        """Await `coroutine` run on this loop, from another loop; cancelling the caller cancels it there."""
        return await asyncio.wrap_future(self.submit(coroutine))


# The stream being pumped in this task: where its request's "sent" stamp goes (see trace_requests).
_request_sent: ContextVar[list[float] | None] = ContextVar("request_sent", default=None)


async def _stamp_request_sent(event: str, info: dict) -> None:
    """httpcore's trace callback (async clients need an async one): just before a request's first byte
    is written, stamp it for its stream (the server cannot see it earlier; a later mark, say its body
    written, could fall after the server began answering)."""
    if event.endswith("send_request_headers.started"):
        holder = _request_sent.get()
        if holder is not None and not holder:
            holder.append(time.perf_counter())


def restart_request_clock() -> None:
    """The request of the stream being pumped is sent again (backends/keepalive.py): its next sending is
    when it left, not the failed one's."""
    holder = _request_sent.get()
    if holder is not None:
        holder.clear()


async def trace_requests(request: Any) -> None:
    """An httpx (or httpx2) request event hook: trace the request's sending (`_stamp_request_sent`).
    Give it to every HTTP client a remote backend streams with: `event_hooks={"request": [trace_requests]}`."""
    request.extensions["trace"] = _stamp_request_sent


_shared: IoLoop | None = None


def shared_io_loop() -> IoLoop:
    """This process's one backend loop."""
    global _shared
    if _shared is None:
        _shared = IoLoop()
    return _shared


class _Failed:
    """The pump's stream raised: the error, to be raised again on the consumer's side."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


# How long a chunk in the middle of a reply may wait on the io loop for others to wake the app's
# loop with (less than one frame of the page's 60 Hz). A reply's first chunks up to its first text,
# its last, its server figures, its end and its errors wake it at once. The stamps are taken where
# the chunks arrive either way: only when the app's loop sees them moves, not what it measures.
HANDOFF_WINDOW_S = 0.01


class Doorbell:
    """Wakes the waiting streams of one consumer loop (the app's) from the io loop's thread.

    Each wake-up from another thread is a write to the loop's self-pipe, and a turn of that loop to
    read it. With a class's replies streaming at once that was one turn per chunk, of every stream
    (30 students at 50 tokens/s: 1,500 a second), and 10 % of the app's loop went to reading its
    pipe. Now a chunk in the middle of a reply rings and waits: every stream rung within
    HANDOFF_WINDOW_S is woken by one call. An urgent ring (see `OffLoopStream._put`) calls at once,
    taking with it whatever else has rung. Measured in a burst of 30 students, paired runs: CPU per
    reply 45, 46, 52 ms against 51, 54, 58 ms without the window (the app's loop 22-26 against
    26-30 ms; its io thread 19-22 against 21-23 ms); first text unchanged.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._rung: list[asyncio.Future] = []
        self._called = False  # a call to _answer is on its way to the consumer's loop
        self._timer = False  # a call is due at the end of the window
        self._lock = threading.Lock()  # the io thread rings while the consumer's loop takes what rang
        self.calls = 0  # the calls made to the consumer's loop (what the window saves)

    def ring(self, waiter: asyncio.Future, urgent: bool) -> None:
        """Wake `waiter` (on the consumer's loop): now if `urgent`, else by the end of the window
        (HANDOFF_WINDOW_S). Called on the io loop."""
        window_s = HANDOFF_WINDOW_S
        with self._lock:
            self._rung.append(waiter)
            if self._called:
                return
            if urgent or window_s <= 0:
                self._called = True
                start_timer = False
            elif self._timer:
                return
            else:
                self._timer = start_timer = True
        if start_timer:
            asyncio.get_running_loop().call_later(window_s, self._window_ends)
        else:
            self._call()

    def _window_ends(self) -> None:
        with self._lock:
            self._timer = False
            if self._called or not self._rung:
                return  # an urgent ring took them already
            self._called = True
        self._call()

    def _call(self) -> None:
        self.calls += 1
        self.loop.call_soon_threadsafe(self._answer)

    def _answer(self) -> None:
        with self._lock:
            rung, self._rung = self._rung, []
            self._called = False
        for waiter in rung:
            _wake(waiter)


_doorbells: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Doorbell]" = weakref.WeakKeyDictionary()


def doorbell(loop: asyncio.AbstractEventLoop) -> Doorbell:
    """The `Doorbell` of consumer loop `loop` (asked on that loop: Chainlit serves every session on one)."""
    bell = _doorbells.get(loop)
    if bell is None:
        bell = _doorbells[loop] = Doorbell(loop)
    return bell


class OffLoopStream:
    """An async iterator on the consumer's loop over a backend stream pumped on the `IoLoop`.

    The pump starts on the first `__anext__` (the request leaves then, as with the backend's own
    stream), stamps each chunk as it arrives and queues it; the consumer takes them in order.
    """

    def __init__(self, io: IoLoop, open_stream: Callable[[], AsyncIterator[StreamChunk]],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._io = io
        self._open = open_stream
        self._clock = clock
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._consumer_loop: asyncio.AbstractEventLoop | None = None
        self._doorbell: Doorbell | None = None
        self._text_put = False  # the pump has put a chunk with text (from then on, middle chunks can wait)
        self._task: asyncio.Task | None = None  # the pump, on the io loop
        self._started = False
        self._ended = False

    def __aiter__(self) -> "OffLoopStream":
        return self

    async def __anext__(self) -> StreamChunk:
        if self._ended:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            self._consumer_loop = asyncio.get_running_loop()
            self._doorbell = doorbell(self._consumer_loop)
            self._io.loop.call_soon_threadsafe(self._start_pump)
        while not self._items:
            waiter = self._consumer_loop.create_future()
            self._waiter = waiter
            if self._items:  # it came between the check and the waiter: no wake-up is needed
                break
            await waiter
        item = self._items.popleft()
        if item is _END:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, _Failed):
            self._ended = True
            raise item.error
        return item

    async def aclose(self) -> None:
        """Cancel the pump and wait until the backend's stream is closed on its loop."""
        self._ended = True
        if self._started:
            await self._io.call(self._stop())

    # ------------------------------------------------------------ on the io loop

    def _start_pump(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _stop(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    async def _pump(self) -> None:
        sent: list[float] = []
        _request_sent.set(sent)  # this task's own context: the transport's trace stamps it
        stream = self._open()
        first = True
        started_at_s = self._clock()
        try:
            async for chunk in stream:
                arrived_at_s = self._clock()
                if first:
                    # Where the request's last byte left; a transport that does not trace: the pump's start.
                    chunk = replace(chunk, arrived_at_s=arrived_at_s,
                                    request_sent_at_s=sent[0] if sent else started_at_s)
                    first = False
                else:
                    chunk = replace(chunk, arrived_at_s=arrived_at_s)
                self._put(chunk)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - raised again, whole, on the consumer's side
            self._put(_Failed(error))
        finally:
            aclose = getattr(stream, "aclose", None)
            try:
                if aclose is not None:
                    await aclose()
            finally:
                self._put(_END)

    def _put(self, item: object) -> None:
        self._items.append(item)
        # The first text, the reply's last chunk and its figures, its end or error: at once.
        urgent = not isinstance(item, StreamChunk) or not self._text_put or item.finish_reason is not None \
            or item.server_figures is not None
        if isinstance(item, StreamChunk) and item.text:
            self._text_put = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._doorbell.ring(waiter, urgent)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class OffLoopBackend:
    """A remote backend whose every call runs on an `IoLoop` (see the module's docstring).

    Coroutine methods are run there and awaited from the caller's loop; `stream()` is pumped there;
    any other attribute is the wrapped backend's own. `inner` is the backend itself.
    """

    def __init__(self, inner: Any, io: IoLoop | None = None) -> None:
        self.inner = inner
        self.io = io or shared_io_loop()

    def stream(self, request: PreparedRequest) -> OffLoopStream:
        return OffLoopStream(self.io, functools.partial(self.inner.stream, request))

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(value):
            return value
        io = self.io

        @functools.wraps(value)
        async def on_io_loop(*args: Any, **kwargs: Any) -> Any:
            return await io.call(value(*args, **kwargs))

        self.__dict__[name] = on_io_loop  # made once: later lookups find it before __getattr__
        return on_io_loop

    def __repr__(self) -> str:
        return f"OffLoopBackend({self.inner!r})"


def off_loop(backend: Any, io: IoLoop | None = None) -> Any:
    """`backend` on the shared backend loop, unless it runs in this process (it stamps its own chunks)."""
    if getattr(backend, "in_process", False) or isinstance(backend, OffLoopBackend):
        return backend
    return OffLoopBackend(backend, io)
