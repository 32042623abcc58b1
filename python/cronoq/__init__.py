"""cronoq: a label-aware task scheduler, from Python.

- :class:`Scheduler`: the embedded scheduler, in this process; executors
  are Python functions (``async def`` on the asyncio loop, plain ``def``
  in a thread pool).
- :class:`Worker`: a remote worker of a ``cronoq server``, over NATS.
- :class:`Client`: submit, look up, cancel and wait over NATS or HTTP.
- Schedules, on both: ``await sched.schedule("nightly", cron="30 2 * * *",
  tz="Europe/Berlin", pool="reports", payload=b"build")`` submits a task
  per tick; ``list_schedules``, ``get_schedule``, ``pause_schedule``,
  ``resume_schedule``, ``delete_schedule``, ``trigger_schedule``,
  ``backfill_schedule``.

Everything is the Rust crate underneath (the same core, worker and
clients); this package converts arguments and runs your Python functions.

Arguments, everywhere:

- payloads are ``bytes`` (a ``str`` is sent as UTF-8; ``bytearray`` works);
- labels are a ``dict`` of ``str`` to ``str`` (or ``"k=v,k=v"`` text);
- durations (``tolerance``, ``attempt_timeout``, ``grace``, ...) are a
  ``datetime.timedelta`` or a number of seconds;
- times (``deadline``, ``start_at``) are a ``datetime.datetime`` (a naive
  one is local time, as ``datetime.timestamp()`` reads it) or a duration
  from now (``timedelta`` or seconds).

Bad arguments raise :class:`InvalidArgument` at the call and change
nothing. Every error is a :class:`Error` with a stable ``code``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, List, Optional, TypeVar

from . import _native
from ._bridge import Pump, _get_running_loop
from ._schedules import (
    BackfillReport,
    Fire,
    MissedTicks,
    ScheduleCalls,
    ScheduleCounters,
    ScheduleEntry,
    ScheduleInfo,
    _then,
)
from ._errors import (
    AlreadyExists,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermanentError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

TaskContext = _native.TaskContext
Outcome = _native.Outcome
TaskStatus = _native.TaskStatus
Attempt = _native.Attempt

__all__ = [
    "AlreadyExists",
    "Attempt",
    "Autoscale",
    "BackfillReport",
    "Client",
    "Demand",
    "Error",
    "FailedPrecondition",
    "Fire",
    "GroupSnapshot",
    "Internal",
    "InvalidArgument",
    "MissedTicks",
    "NotFound",
    "Outcome",
    "PermanentError",
    "PermissionDenied",
    "PoolSnapshot",
    "ResourceExhausted",
    "ScheduleCounters",
    "ScheduleEntry",
    "ScheduleInfo",
    "Scheduler",
    "Snapshot",
    "TaskContext",
    "TaskHandle",
    "TaskStatus",
    "Unauthenticated",
    "Unavailable",
    "Worker",
    "WorkerInfo",
    "enable_telemetry",
]


def enable_telemetry() -> bool:
    """Exports OpenTelemetry traces as the standard ``OTEL_*`` env vars say
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``,
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``): the task spans of
    schedulers made with ``telemetry=True`` and the attempt spans of remote
    workers. ``True`` when an endpoint is configured, ``False`` when
    telemetry stays off. What is queued is sent when the interpreter exits.
    """
    return _native.enable_telemetry()


# Spans still queued go out before the interpreter ends (a no-op when
# telemetry was never enabled).
atexit.register(_native.shutdown_telemetry)

F = TypeVar("F", bound=Callable[..., Any])


# --- snapshots --------------------------------------------------------------


@dataclass(frozen=True)
class GroupSnapshot:
    """One label group of a pool."""

    labels: Dict[str, str]
    capacity: int
    busy: int
    workers: int = 0


@dataclass(frozen=True)
class Demand:
    """Tasks waiting with exactly these required labels."""

    labels: Dict[str, str]
    waiting: int
    reason: Optional[str] = None
    """Why they wait: ``no_group_matches``, ``groups_full`` or ``held_for_reservation``."""


@dataclass(frozen=True)
class Autoscale:
    """``desired = clamp(busy + waiting + due reservations, min, max)``."""

    desired: int
    min: int
    max: int


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool: its groups (least specialized first), demand and autoscaling signal."""

    name: str
    capacity: int
    busy: int
    waiting: int
    scheduled: int
    reserved: int
    deadline_missed: int
    autoscale: Autoscale
    demand: List[Demand]
    groups: List[GroupSnapshot]

    def group(self, labels: Optional[Dict[str, str]] = None) -> Optional[GroupSnapshot]:
        """The group with exactly ``labels`` (``None``/``{}``: the unlabeled one), if shown."""
        want = labels or {}
        return next((g for g in self.groups if g.labels == want), None)


@dataclass(frozen=True)
class WorkerInfo:
    """A remote worker (distributed mode)."""

    id: str
    pool: str
    labels: Dict[str, str]
    slots: int
    busy: int
    last_seen: int
    draining: bool = False


@dataclass(frozen=True)
class Snapshot:
    """The scheduler at one instant: the JSON of ``GET /v1/snapshot`` as objects."""

    pools: List[PoolSnapshot]
    workers: List[WorkerInfo] = field(default_factory=list)
    leader: Optional[Dict[str, Any]] = None
    _native: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def _of(cls, native: Any) -> "Snapshot":
        data = json.loads(native.json())
        pools = [
            PoolSnapshot(
                name=p["name"],
                capacity=p["capacity"],
                busy=p["busy"],
                waiting=p["waiting"],
                scheduled=p["scheduled"],
                reserved=p["reserved"],
                deadline_missed=p.get("deadline_missed", 0),
                autoscale=Autoscale(**p["autoscale"]),
                demand=[Demand(**d) for d in p["demand"]],
                groups=[GroupSnapshot(**g) for g in p["groups"]],
            )
            for p in data["pools"]
        ]
        workers = [WorkerInfo(**w) for w in data.get("workers") or []]
        return cls(pools=pools, workers=workers, leader=data.get("leader"), _native=native)

    def pool(self, name: str) -> Optional[PoolSnapshot]:
        """The pool called ``name``, if it has groups or waiting tasks."""
        return next((p for p in self.pools if p.name == name), None)

    def to_table(self) -> str:
        """The table ``cronoq snapshot`` prints."""
        return str(self._native.table())

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of ``GET /v1/snapshot`` as a dict."""
        return dict(json.loads(self._native.json()))

    def __str__(self) -> str:
        return self.to_table()


# --- embedded ---------------------------------------------------------------


class TaskHandle:
    """A submitted task: its ``id``, and :meth:`wait` for its :class:`Outcome`.

    ``await sched.submit(...)`` gives the handle; the task is submitted
    when ``submit`` is called, so the ``await`` never suspends.
    """

    __slots__ = ("_sched", "_native", "id")

    def __init__(self, sched: "Scheduler", native: Any) -> None:
        self._sched = sched
        self._native = native
        self.id: int = native.id

    def __await__(self) -> Generator[Any, None, "TaskHandle"]:
        return self
        yield  # a generator that never suspends

    def wait(self) -> "asyncio.Future[Outcome]":
        """An awaitable of the task's outcome (succeeded, failed, cancelled or missed).

        Returns an ``asyncio.Future`` (not a coroutine), so gathering many
        waits creates no task per wait.
        """
        pump = self._sched._pump
        loop = pump.require()
        key = self._native.watch(pump.native)
        if key is None:
            key = self._sched._native.watch(self.id, pump.native)
        fut = loop.create_future()
        pump.waiters[key] = fut
        return fut

    def cancel(self) -> None:
        """Cancels the task (see :meth:`Scheduler.cancel`)."""
        self._sched.cancel(self.id)

    def __repr__(self) -> str:
        return f"TaskHandle(id={self.id})"


class Scheduler(ScheduleCalls):
    """The embedded scheduler: pools of label groups with capacity, and
    executors that run the attempts, all in this process.

    Executors run on the asyncio loop that submits (``async def``) or in a
    thread pool of ``threads`` threads (plain functions). Scheduling itself
    is Rust, with the GIL released.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: Optional[int] = None,
        retain_finished: Optional[int] = None,
        threads: Optional[int] = None,
        telemetry: bool = False,
    ) -> None:
        self._native = _native.Scheduler(
            max_payload_bytes=max_payload_bytes,
            retain_finished=retain_finished,
            telemetry=telemetry,
        )
        self._pump = Pump(threads)
        # The loop holds the pump (its reader) after the scheduler is gone:
        # let go of the loop and the pipe with the scheduler.
        weakref.finalize(self, self._pump.close)

    def set_capacity(self, pool: str, slots: int) -> None:
        """Slots of the pool's unlabeled group."""
        self._native.set_capacity(pool, slots)

    def set_group_capacity(self, pool: str, labels: Dict[str, str], slots: int) -> None:
        """Slots of the pool's group that carries exactly ``labels``."""
        self._native.set_group_capacity(pool, labels, slots)

    def configure_pool(self, pool: str, **settings: Any) -> None:
        """Pool settings: ``max_attempts``, ``urgency_window``, ``max_bypass``,
        ``reservation_lead``, ``on_miss`` (``"skip"``/``"run"``),
        ``autoscale_min``, ``autoscale_max``, ``backoff=(initial, max)``;
        sharing the pool (SPEC §9): ``fairness={key: weight}``,
        ``quotas=[{"key", "labels", "max_running"}]``, ``preemption``
        (``"off"``/``"priority"``), ``preemption_grace``.
        Settings not given take their defaults."""
        self._native.configure_pool(pool, **settings)

    def executor(self, pool: str) -> Callable[[F], F]:
        """Registers the decorated function as the pool's executor:
        ``run(ctx, payload)`` returns ``bytes``, ``str`` or ``None``; an
        exception is a failed attempt (retried; :class:`PermanentError`
        fails the task at once). Replaces an earlier executor."""

        def register(fn: F) -> F:
            slot = self._pump.add(fn)
            self._native.executor(pool, self._pump.native, slot)
            return fn

        return register

    def submit(self, payload: Any, **options: Any) -> TaskHandle:
        """Submits a task; ``await`` it for its :class:`TaskHandle`.

        Options: ``pool`` (default ``"default"``), ``labels``,
        ``priority``, ``deadline``, ``start_at``, ``tolerance``,
        ``max_attempts``, ``idempotency_key``, ``attempt_timeout``,
        ``est_runtime``, ``backoff=(initial, max)``; sharing a pool
        (SPEC §9): ``fairness_key``, ``fairness_weight``,
        ``concurrency_key``, ``concurrency_limit``, ``concurrency_policy``
        (``"queue"``, ``"replace_waiting"``, ``"cancel_running"``,
        ``"skip"``), ``preemptible``.
        """
        pump = self._pump
        if _get_running_loop() is not pump.loop:
            pump.ensure()
        return TaskHandle(self, self._native.submit(payload, **options))

    def cancel(self, task: Any) -> None:
        """Cancels a task (an id or a handle): a waiting one ends at once,
        a running one's executor is cancelled."""
        self._native.cancel(task.id if isinstance(task, TaskHandle) else task)

    def task(self, task_id: int) -> Optional[TaskStatus]:
        """A task's status (live or recently finished), or ``None``."""
        return self._native.task(task_id)

    def wait(self, task_id: int) -> "asyncio.Future[Outcome]":
        """An awaitable of a task's outcome, by id (live or recently finished)."""
        loop = self._pump.require()
        key = self._native.watch(task_id, self._pump.native)
        fut = loop.create_future()
        self._pump.waiters[key] = fut
        return fut

    def snapshot(self) -> Snapshot:
        """Pools, groups (labels, capacity, busy), demand, autoscaling."""
        return Snapshot._of(self._native.snapshot())

    def _call(self, call: Callable[[Any], Any], convert: Callable[[Any], Any]) -> Any:
        # The tasks a schedule fires run their executors on this loop, as
        # submitted ones do.
        pump = self._pump
        if _get_running_loop() is not pump.loop:
            pump.ensure()
        return _then(call(self._native.schedules()), convert)

    def close(self) -> None:
        """Detaches from the event loop and stops the executor threads."""
        self._pump.close()
        self._pump.shutdown_threads()


# --- remote -----------------------------------------------------------------


class Worker:
    """A remote worker: registers with the ``cronoq server`` at
    ``nats_url`` in ``pool`` with ``labels`` and ``slots``, and runs the
    :meth:`handler` for each attempt it is leased.

    Options are checked here (bad ones raise :class:`InvalidArgument`).
    ``grace`` (default 30 s) is how long running attempts may take to
    finish when the worker drains.
    """

    def __init__(
        self,
        nats_url: str,
        *,
        pool: str = "default",
        labels: Optional[Dict[str, str]] = None,
        slots: int = 1,
        token: Optional[str] = None,
        nkey_seed: Optional[str] = None,
        id: Optional[str] = None,
        grace: Any = None,
        prefix: Optional[str] = None,
        threads: Optional[int] = None,
    ) -> None:
        self._native = _native.Worker(
            nats_url,
            pool=pool,
            labels=labels,
            slots=slots,
            token=token,
            nkey_seed=nkey_seed,
            id=id,
            grace=grace,
            prefix=prefix,
        )
        self._pump = Pump(threads)
        self._slot: Optional[int] = None
        self.draining = False

    @property
    def id(self) -> str:
        """The worker id (given, or generated)."""
        return str(self._native.id)

    def handler(self, fn: F) -> F:
        """Registers the decorated ``run(ctx, payload)`` (see :meth:`Scheduler.executor`)."""
        self._slot = self._pump.add(fn)
        return fn

    async def run(self) -> None:
        """Runs until cancelled, :meth:`stop` or SIGTERM, then drains: the
        server stops leasing to it, running attempts get the grace period,
        the rest are aborted (and retried elsewhere), it deregisters.

        Raises the error that stopped it (a refused registration, ...)."""
        if self._slot is None:
            raise FailedPrecondition("register a handler first: @worker.handler")
        loop = self._pump.require()
        self.draining = False
        running = self._native.run(self._pump.native, self._slot)
        on_sigterm = threading.current_thread() is threading.main_thread()
        if on_sigterm:
            try:
                loop.add_signal_handler(signal.SIGTERM, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):
                on_sigterm = False
        try:
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError:
                self.stop()
                await running
                raise
        finally:
            if on_sigterm:
                loop.remove_signal_handler(signal.SIGTERM)

    def stop(self) -> None:
        """Asks a running worker to drain and stop; :meth:`run` then returns."""
        self.draining = True
        self._native.stop()


class Client(ScheduleCalls):
    """A client of a distributed cronoq: ``nats://...`` over NATS,
    ``http://...`` over the HTTP API. Connects on first use (or
    ``await client.connect()``; ``async with`` works too).

    Credentials, for a server whose config says ``[auth] required = true``
    (give at most one): ``token`` (a cronoq token; over HTTP the
    ``Authorization: Bearer`` token), ``token_env`` (the name of the
    environment variable holding it, read here), or ``nkey_seed`` (an nkey
    user seed ``SU...`` as ``cronoq keygen`` prints it; NATS only).
    ``nats_token`` is something else: the NATS connection token, when the
    NATS server itself asks for one. Bad options raise
    :class:`InvalidArgument` here, before anything connects; a credential
    the server refuses raises :class:`Unauthenticated` or
    :class:`PermissionDenied` on the call."""

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        token_env: Optional[str] = None,
        nkey_seed: Optional[str] = None,
        nats_token: Optional[str] = None,
        prefix: Optional[str] = None,
        request_timeout: Any = None,
    ) -> None:
        if not isinstance(url, str) or "://" not in url:
            raise InvalidArgument(
                f"url must be a nats://, tls://, http:// or https:// URL, not {url!r}"
            )
        if token_env is not None:
            if token is not None or nkey_seed is not None:
                raise InvalidArgument("give token, token_env or nkey_seed, not more than one")
            token = os.environ.get(token_env)
            if not token:
                raise InvalidArgument(f"token_env names {token_env}, which is not set")
        self.url = url
        self._options: Dict[str, Any] = dict(
            token=token,
            nkey_seed=nkey_seed,
            nats_token=nats_token,
            prefix=prefix,
            request_timeout=request_timeout,
        )
        _native.Client.check(url, **self._options)
        self._native: Any = None
        self._lock: Optional[asyncio.Lock] = None

    async def connect(self) -> "Client":
        """Connects now (otherwise the first call does)."""
        await self._client()
        return self

    async def _client(self) -> Any:
        if self._native is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._native is None:
                    self._native = await _native.Client.connect(self.url, **self._options)
        return self._native

    async def __aenter__(self) -> "Client":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        self._native = None

    async def submit(self, payload: Any, **options: Any) -> int:
        """Submits a task (the options of :meth:`Scheduler.submit`); its id
        once the server holds it durably."""
        client = await self._client()
        return int(await client.submit(payload, **options))

    async def get(self, task_id: int) -> TaskStatus:
        """A task's state, why it waits, attempts and result."""
        client = await self._client()
        return await client.get(task_id)

    async def cancel(self, task_id: int) -> None:
        """Cancels a task."""
        client = await self._client()
        await client.cancel(task_id)

    async def wait(self, task_id: int) -> TaskStatus:
        """Waits until a task is finished; its final status."""
        client = await self._client()
        return await client.wait(task_id)

    async def snapshot(self) -> Snapshot:
        """Pools, groups, demand and workers."""
        client = await self._client()
        return Snapshot._of(await client.snapshot())

    async def _call(self, call: Callable[[Any], Any], convert: Callable[[Any], Any]) -> Any:
        client = await self._client()
        return convert(await call(client.schedules()))
