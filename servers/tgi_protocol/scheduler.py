"""Admission and queueing in the stand-in: TGI's concurrency permit, and generations on the engine's thread.

A request takes a slot (`admit`) or is refused with "Model is overloaded", as
TGI's router refuses past --max-concurrent-requests. A generation started with
`start` runs on the engine's worker thread(s); its tokens arrive on an asyncio
queue that `tokens` drains. Every generation keeps a `GenerationRecord` a test
can read.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import AsyncIterator

from servers.tgi_protocol.engines import Engine, GenerationRecord, Job
from servers.tgi_protocol.errors import generation_error, overloaded_error
from servers.tgi_protocol.faults import Faults
from servers.tgi_protocol.validation import Limits, ValidRequest


class Scheduler:
    """The slots in use and every generation so far."""

    def __init__(self, engine: Engine, limits: Limits, faults: Faults) -> None:
        self.engine = engine
        self.limits = limits
        self.faults = faults
        self.in_flight = 0
        self.generations: list[GenerationRecord] = []
        self._ids = itertools.count(1)

    def admit(self) -> None:
        """Take a slot, as TGI's router takes a semaphore permit, or refuse with "overloaded"."""
        if self.in_flight >= self.limits.max_concurrent:
            raise overloaded_error()
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def start(self, path: str, request: ValidRequest) -> tuple[Job, asyncio.Queue]:
        """Queue a generation on the worker thread; its events arrive on the returned queue."""
        record = GenerationRecord(next(self._ids), path, max_new_tokens=request.max_new_tokens,
                                  adapter_id=request.adapter_id)
        self.generations.append(record)
        job = Job(request, record)
        self.faults.arm(job)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(item: tuple) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            job.running_at_s = time.monotonic()
            try:
                self.engine.run(job, emit)
            except (RuntimeError, ValueError, OSError) as error:  # llama.cpp decode failures
                record.status = "failed"
                emit(("error", generation_error(str(error))))

        loop.run_in_executor(self.engine.executor, work)
        return job, queue

    @staticmethod
    async def tokens(queue: asyncio.Queue) -> AsyncIterator[tuple]:
        """The worker's events until the last token, an error or a cancellation."""
        while True:
            item = await queue.get()
            yield item
            if item[0] != "token" or item[2] is not None:
                return

    def counts(self) -> tuple[int, int]:
        """(waiting for the engine, generating now): TGI's queue size and current batch size."""
        statuses = [record.status for record in self.generations]
        return statuses.count("queued"), statuses.count("running")
