"""The engine's queue in ``slea serve``: who may wait, what runs off the engine and what on it.

A request is admitted (:meth:`Gate.admit`: at most ``max_queue`` waiting, being prepared or generating; more is a
429), prepared off the engine's slot (:meth:`Gate.prepare`: parsed, checked, rendered and tokenized in a worker
thread of its own, so a large prompt never holds the engine), then run on the engine, one at a time
(:meth:`Gate.start`). Every step is bounded by the request's deadline, set at its arrival: past it, waiting is a
503, preparing or generating a 504; a generation stops between two decode steps when the deadline passes, the
client disconnects or the server shuts down (its ``cancel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from slea.policy.openai_protocol import RequestError, error_body
from slea.policy.serve_stream import sse_event

log = logging.getLogger(__name__)


class Ticket:
    """One admitted request: ``gone`` is set when its client disconnects; it leaves the queue at :meth:`close`
    (once, however often called)."""

    def __init__(self, gate: Gate, request, deadline: float):
        self.gate, self.deadline = gate, deadline
        self.gone = threading.Event()
        self.watcher = asyncio.ensure_future(_disconnected(request))
        self.watcher.add_done_callback(lambda t: t.cancelled() or self.gone.set())
        self.open = True
        gate.pending += 1

    def cancelled(self) -> bool:
        """Whether generation must stop: the client is gone, the server stops or the deadline has passed."""
        return self.gone.is_set() or self.gate.stopping.is_set() or time.monotonic() > self.deadline

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def close(self) -> None:
        if self.open:
            self.open = False
            self.gate.pending -= 1
            self.watcher.cancel()


class Gate:
    """One generation at a time, at most ``max_queue`` requests admitted (module docstring). ``timeout_s`` is
    what error messages cite (``--request-timeout``)."""

    def __init__(self, max_queue: int, timeout_s: float):
        self.max_queue, self.timeout_s = max_queue, timeout_s
        self.pending = 0
        self.slot = asyncio.Semaphore(1)
        self.stopping = threading.Event()  # the server shuts down: in-flight generations stop
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slea-engine")
        self.prep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slea-prepare")

    def admit(self, request, deadline: float) -> Ticket:
        if self.pending >= self.max_queue:
            raise RequestError(429, f"the server is busy: {self.pending} requests are waiting or running "
                                    f"(--max-queue {self.max_queue}); retry later", code="rate_limit_exceeded")
        return Ticket(self, request, deadline)

    async def prepare(self, ticket: Ticket, work: Callable[[], object]):
        """``work()`` in the preparing thread, within the ticket's deadline (a 504 past it: the thread finishes the
        bounded work it started, for nobody)."""
        future = asyncio.get_running_loop().run_in_executor(self.prep, work)
        try:
            return await asyncio.wait_for(asyncio.shield(future), ticket.left())
        except TimeoutError:
            raise RequestError(504, f"no answer within {self.timeout_s:g}s (--request-timeout): the request was "
                                    f"still being checked and tokenized", code="timeout") from None

    async def start(self, ticket: Ticket, work: Callable[[Callable[[], bool]], object]) -> asyncio.Future | None:
        """Once the engine is free, ``work(cancel)`` in the engine's thread; the future it returns releases the
        engine and closes the ticket when the work ends. ``None`` when the client left while waiting; a 503 when
        the deadline passed first."""
        acquire = asyncio.ensure_future(self.slot.acquire())
        done, _ = await asyncio.wait({acquire, ticket.watcher}, timeout=ticket.left(),
                                     return_when=asyncio.FIRST_COMPLETED)
        if acquire not in done:
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquire
            if not acquire.cancelled():
                self.slot.release()
            if ticket.gone.is_set():
                return None
            raise RequestError(503, f"no answer within {self.timeout_s:g}s: the request waited for the engine all "
                                    f"that time (--request-timeout)", code="timeout")
        future = asyncio.get_running_loop().run_in_executor(self.pool, work, ticket.cancelled)
        future.add_done_callback(lambda f: (self.slot.release(), ticket.close()))
        return future

    async def result(self, ticket: Ticket, future: asyncio.Future):
        """What the work returned; ``None`` when it stopped for a client that left or a server that stops, a 504
        when it stopped at the deadline."""
        from slea.policy.generation import GenerationCancelled

        try:
            return await future
        except GenerationCancelled:
            if ticket.gone.is_set() or self.stopping.is_set():
                return None
            raise RequestError(504, f"no answer within {self.timeout_s:g}s (--request-timeout): generation stopped",
                               code="timeout") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.prep.shutdown(wait=False, cancel_futures=True)


class Pipe:
    """A streamed answer's chunks, from the engine's thread (:meth:`put`) to the response (:meth:`events`), in
    order. The chunks put while the event loop is busy go on together, as one write (a decode step's rows)."""

    END = object()

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.lock = threading.Lock()
        self.waiting: list[bytes] = []  # events put, not yet handed to the loop

    def put(self, chunk: dict) -> None:
        """In the engine's thread: ``chunk`` as a server-sent event (encoded here, off the event loop)."""
        event = sse_event(chunk)
        with self.lock:
            self.waiting.append(event)
            if len(self.waiting) > 1:  # a hand-over is already on its way: it takes this one too
                return
        self.loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        with self.lock:
            events, self.waiting = self.waiting, []
        self.queue.put_nowait(b"".join(events))

    async def events(self, gate: Gate, ticket: Ticket, future: asyncio.Future):
        """The events as they come; once the work ends, an error event if it failed (past its time limit: the
        504's error), then ``data: [DONE]``. A client that leaves stops the generation."""
        future.add_done_callback(lambda f: self.queue.put_nowait(self.END))
        try:
            while (event := await self.queue.get()) is not self.END:
                yield event
            try:
                await gate.result(ticket, future)
            except RequestError as exc:
                yield sse_event(error_body(exc.status, str(exc), exc.param, exc.code))
            except Exception as exc:  # the stream has begun: the error goes in it
                log.exception("streamed request failed")
                yield sse_event(error_body(500, f"{type(exc).__name__}: {exc}"))
            yield b"data: [DONE]\n\n"
        finally:
            ticket.gone.set()


async def _disconnected(request) -> None:
    """Returns when the client has gone (after the body was read, the next ASGI message is the disconnect)."""
    with contextlib.suppress(Exception):  # a receive that fails: the connection is gone all the same
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return
