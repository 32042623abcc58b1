"""The asyncio side of the bridge between tokio and one event loop.

Rust queues a job for every attempt a Python executor or handler must run
(see ``python/src/bridge.rs``) and wakes the loop through a pipe, once per
batch. :meth:`Pump._pump` runs on the loop when the pipe is readable and
takes the whole batch in one native call: it starts an asyncio task per
job (``async def`` functions run on the loop; plain functions in a thread
pool), cancels the tasks of revoked attempts, and resolves the futures of
waiters whose outcome arrived.

A pump follows the running loop: the first call from another loop moves
it there (jobs queued meanwhile wait for it; jobs running on a loop that
has gone away are answered as failed, and retried, when Rust notices their
answer will never come).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _native
from ._errors import PermanentError

_get_running_loop = asyncio.events._get_running_loop


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)
    )


class Pump:
    """One native bridge, the Python functions it runs, and the loop it runs them on."""

    def __init__(self, threads: Optional[int] = None) -> None:
        self.native = _native.Bridge()
        self.handlers: List[Tuple[Callable[..., Any], bool]] = []
        self.running: Dict[int, "asyncio.Task[None]"] = {}
        self.waiters: Dict[int, "asyncio.Future[Any]"] = {}
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._fds: Optional[Tuple[int, int]] = None
        self._threads = threads
        self._pool: Optional[ThreadPoolExecutor] = None

    def add(self, fn: Callable[..., Any]) -> int:
        """Registers ``fn``; its slot number for the native side."""
        if not callable(fn):
            from ._errors import InvalidArgument

            raise InvalidArgument(f"an executor must be callable, not {type(fn).__name__}")
        self.handlers.append((fn, is_async(fn)))
        return len(self.handlers) - 1

    def ensure(self) -> Optional[asyncio.AbstractEventLoop]:
        """Attaches to the running loop, if any and not attached yet; that loop."""
        loop = _get_running_loop()
        if loop is not None and loop is not self.loop:
            self._attach(loop)
        return loop

    def require(self) -> asyncio.AbstractEventLoop:
        """Like :meth:`ensure`, but there must be a running loop."""
        loop = self.ensure()
        if loop is None:
            raise RuntimeError("cronoq: this must be called from a coroutine running on an asyncio loop")
        return loop

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.close()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._fds = (r, w)
        self.loop = loop
        loop.add_reader(r, self._pump)
        self.native.attach(w)

    def close(self) -> None:
        """Detaches from the loop (if any) and closes the pipe."""
        self.native.detach()
        if self._fds is not None:
            r, w = self._fds
            self._fds = None
            loop = self.loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.remove_reader(r)
                except Exception:  # the loop may be shutting down
                    pass
            os.close(r)
            os.close(w)
        self.loop = None
        # Tasks of another loop cannot be cancelled from here; their jobs
        # are answered (failed) when those tasks are collected.
        self.running.clear()
        for fut in self.waiters.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.cancel()
        self.waiters.clear()

    def _pump(self) -> None:
        fds = self._fds
        if fds is None:
            return
        try:
            os.read(fds[0], 4096)
        except (BlockingIOError, InterruptedError):
            pass
        jobs, revoked, done = self.native.take()
        if jobs:
            loop = self.loop
            assert loop is not None
            create_task = loop.create_task
            handlers = self.handlers
            running = self.running
            run_async = self._run_async
            run_sync = self._run_sync
            for job in jobs:
                fn, asynchronous = handlers[job.slot]
                running[job.key] = create_task(
                    run_async(fn, job) if asynchronous else run_sync(fn, job)
                )
        for key in revoked:
            task = self.running.pop(key, None)
            if task is not None:
                task.cancel()
        if done:
            waiters = self.waiters
            for key, value in done:
                fut = waiters.pop(key, None)
                if fut is None or fut.done():
                    continue
                if isinstance(value, BaseException):
                    fut.set_exception(value)
                else:
                    fut.set_result(value)

    async def _run_async(self, fn: Callable[..., Any], job: Any) -> None:
        try:
            output = await fn(job.ctx, job.payload)
        except asyncio.CancelledError:
            # Revoked (the key is gone from `running`): Rust knows. Else the
            # loop or user code cancelled it: a failed attempt, retried.
            if self.running.pop(job.key, None) is not None:
                job.fail("the attempt's asyncio task was cancelled", True)
            raise
        except PermanentError as e:
            self.running.pop(job.key, None)
            job.fail(_format(e), False)
        except BaseException as e:
            self.running.pop(job.key, None)
            job.fail(_format(e), True)
            if not isinstance(e, Exception):
                raise
        else:
            self.running.pop(job.key, None)
            _succeed(job, output)

    async def _run_sync(self, fn: Callable[..., Any], job: Any) -> None:
        loop = self.loop
        assert loop is not None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="cronoq-executor")
        try:
            output = await loop.run_in_executor(self._pool, fn, job.ctx, job.payload)
        except asyncio.CancelledError:
            if self.running.pop(job.key, None) is not None:
                job.fail("the attempt's asyncio task was cancelled", True)
            raise
        except PermanentError as e:
            self.running.pop(job.key, None)
            job.fail(_format(e), False)
        except BaseException as e:
            self.running.pop(job.key, None)
            job.fail(_format(e), True)
            if not isinstance(e, Exception):
                raise
        else:
            self.running.pop(job.key, None)
            _succeed(job, output)

    def shutdown_threads(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _succeed(job: Any, output: Any) -> None:
    try:
        job.succeed(output)
    except Exception as e:  # not bytes, str or None
        job.fail(f"{e}", True)
