"""Micro-batching: concurrent requests are gathered (bounded size and wait) and run together."""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from service.errors import OverloadedError
from service.outage_log import OutageLog

log = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

# A batch function returns one entry per item: its result, or the error for that item alone.
BatchFunction = Callable[[Sequence[ItemT]], Sequence["ResultT | Exception"]]


class MicroBatcher(Generic[ItemT, ResultT]):
    """Gathers items submitted concurrently and hands them to `process` in one call.

    Adaptive: a batch takes every item already queued (up to `max_size`): while one batch
    runs, the next fills with what arrives, so batches grow with the load and a lone request
    is never held back. With `max_wait_s` > 0 a batch also waits up to that long after its
    first item for more, but only under load, i.e. when the previous batch held more than one
    item. The service's default is no wait: on 2 cores (demo text search, 16 draws;
    benchmarks/results/service_bench_window.md) a 5 ms wait raised p50 at 2 clients from 5.5
    to 8.3 ms (the batch waits for items that cannot come while both clients are in it), cut
    QPS at 4 and 16 clients by a third and a fifth, and gained nothing at 64 (1044 against
    1078 QPS). `process` runs in a dedicated worker thread, never on the event loop.
    `thread_initializer` runs once in that thread (per-thread settings such as OpenMP's thread
    count belong there). With `concurrency` > 1, that many batches may run at once, each in a
    worker thread of its own: while one runs, the next gathers and starts, so a process whose
    numeric pools hold one thread each can keep more than one core busy. At most `max_queue`
    items wait;
    beyond that, submit() raises OverloadedError (HTTP 503) instead of queueing without bound.

    With `inline_when_alone`, an item submitted with `alone=True` (the caller knows no other
    request is under way) while nothing is queued or running is processed at once on the event
    loop's thread: a lone request then skips the two thread hand-offs of the worker (up to 0.7 ms
    of a 4-5 ms text search on 2 cores). Any other request keeps the worker, so under
    load the loop stays free to parse requests while a batch runs. `thread_initializer` then
    also runs once on the loop's thread.
    """

    def __init__(
        self,
        process: BatchFunction,
        *,
        max_size: int,
        max_wait_s: float,
        max_queue: int = 1024,
        on_batch: Callable[[int], None] | None = None,
        name: str = "batcher",
        thread_initializer: Callable[[], object] | None = None,
        inline_when_alone: bool = False,
        concurrency: int = 1,
    ) -> None:
        if max_size < 1 or max_wait_s < 0 or concurrency < 1:
            raise ValueError("max_size and concurrency must be >= 1 and max_wait_s >= 0")
        self._process = process
        self._max_size = max_size
        self._max_wait_s = max_wait_s
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._name = name
        self._thread_initializer = thread_initializer
        self._inline_when_alone = inline_when_alone
        self._last_batch_size = 0
        self._failures = OutageLog(log, f"{name}: a batch")
        self._concurrency = concurrency
        self._busy = 0  # batches being gathered or processed
        self._queue: asyncio.Queue[tuple[ItemT, asyncio.Future]] | None = None
        self._tasks: list[asyncio.Task] = []
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Start the gathering loop on the running event loop."""
        self._queue = asyncio.Queue(maxsize=self._max_queue)
        self._executor = ThreadPoolExecutor(
            max_workers=self._concurrency,
            thread_name_prefix=self._name,
            initializer=self._thread_initializer,
        )
        self._tasks = [
            asyncio.create_task(self._run(), name=f"{self._name}-{n}")
            for n in range(self._concurrency)
        ]
        if self._inline_when_alone and self._thread_initializer is not None:
            self._thread_initializer()

    async def stop(self) -> None:
        """Stop gathering; items still waiting fail with OverloadedError."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._queue is not None:
            while not self._queue.empty():
                _, future = self._queue.get_nowait()
                if not future.done():
                    future.set_exception(OverloadedError("the service is shutting down; retry"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def submit(self, item: ItemT, *, alone: bool = False) -> ResultT:
        """Queue `item` and wait for its result (or its error); `alone`: see the class doc."""
        if self._queue is None or not self._tasks or any(t.done() for t in self._tasks):
            raise OverloadedError("the search worker is not running; retry shortly")
        if alone and self._inline_when_alone and self._queue.empty() and not self._busy:
            return self._process_now(item)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait((item, future))
        except asyncio.QueueFull:
            raise OverloadedError(
                f"too many queued searches (more than {self._max_queue}); retry shortly"
            ) from None
        return await future

    def _process_now(self, item: ItemT) -> ResultT:
        """A batch of one on the calling (event loop) thread."""
        self._last_batch_size = 1
        try:
            (result,) = self._process([item])
            if self._failures.count:  # an outage is ending
                self._failures.succeeded()
        except Exception as error:
            self._failures.failed(error)
            result = error
        if self._on_batch is not None:
            self._on_batch(1)
        if isinstance(result, Exception):
            raise result
        return result

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather(loop)
            self._last_batch_size = len(batch)
            items = [item for item, _ in batch]
            try:
                results = await loop.run_in_executor(self._executor, self._process, items)
                if len(results) != len(items):
                    raise RuntimeError(f"batch function returned {len(results)} results")
                if self._failures.count:  # an outage is ending
                    self._failures.succeeded()
            except Exception as error:  # the batch failed as a whole: every item gets the error
                self._failures.failed(error)
                results = [error] * len(items)
            if self._on_batch is not None:
                self._on_batch(len(items))
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # the client went away
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            self._busy -= 1

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> list[tuple[ItemT, asyncio.Future]]:
        """Wait for a first item, then collect what is queued, and under load (the last batch
        held more than one item) what arrives until the batch is full or the wait ends."""
        assert self._queue is not None
        batch = [await self._queue.get()]
        self._busy += 1
        wait_s = self._max_wait_s if self._last_batch_size > 1 else 0.0
        deadline = loop.time() + wait_s
        while len(batch) < self._max_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch
