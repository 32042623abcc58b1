"""Type stubs of the public ``cronoq`` API (the implementation is
``__init__.py`` over the Rust extension ``_native``)."""

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Literal,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

from ._errors import (
    AlreadyExists as AlreadyExists,
    Error as Error,
    FailedPrecondition as FailedPrecondition,
    Internal as Internal,
    InvalidArgument as InvalidArgument,
    NotFound as NotFound,
    PermanentError as PermanentError,
    PermissionDenied as PermissionDenied,
    ResourceExhausted as ResourceExhausted,
    Unauthenticated as Unauthenticated,
    Unavailable as Unavailable,
)
from ._schedules import (
    BackfillReport as BackfillReport,
    Fire as Fire,
    MissedTicks as MissedTicks,
    ScheduleCounters as ScheduleCounters,
    ScheduleEntry as ScheduleEntry,
    ScheduleInfo as ScheduleInfo,
)
from ._native import (
    Attempt as Attempt,
    Outcome as Outcome,
    TaskContext as TaskContext,
    TaskStatus as TaskStatus,
)

Payload = Union[bytes, bytearray, str]
Labels = Union[Dict[str, str], str]
Duration = Union[timedelta, int, float]
"""A ``timedelta`` or a number of seconds."""
Time = Union[datetime, timedelta, int, float]
"""A ``datetime`` (naive = local time) or a duration from now."""
ConcurrencyPolicy = Literal["queue", "replace_waiting", "cancel_running", "skip"]
"""What admission does when a concurrency key's limit is full (SPEC §9)."""
Output = Union[bytes, str, None]
AsyncExecutor = Callable[[TaskContext, bytes], Awaitable[Output]]
SyncExecutor = Callable[[TaskContext, bytes], Output]
F = TypeVar("F", bound=Callable[..., Any])
Span = Union[str, timedelta, int, float]
"""A duration as text (``"5m"``, ``"1h 30m"``), a ``timedelta`` or seconds."""
Instant = Union[str, datetime, timedelta, int, float]
"""RFC 3339 text, a ``datetime``, or a duration from now."""

class ScheduleCalls:
    """The schedule calls of :class:`Scheduler` and :class:`Client`."""

    def schedule(
        self,
        name: str,
        *,
        cron: Optional[str] = ...,
        every: Optional[Span] = ...,
        tz: Optional[str] = ...,
        overlap: Optional[str] = ...,
        catchup_window: Optional[Span] = ...,
        jitter: Optional[Span] = ...,
        paused: bool = ...,
        payload: Optional[Payload] = ...,
        pool: Optional[str] = ...,
        labels: Optional[Labels] = ...,
        priority: Optional[int] = ...,
        max_attempts: Optional[int] = ...,
        attempt_timeout: Optional[Span] = ...,
        deadline: Optional[Span] = ...,
    ) -> Awaitable[ScheduleInfo]: ...
    def list_schedules(self) -> Awaitable[List[ScheduleEntry]]: ...
    def get_schedule(self, name: str) -> Awaitable[ScheduleInfo]: ...
    def pause_schedule(self, name: str) -> Awaitable[ScheduleInfo]: ...
    def resume_schedule(self, name: str) -> Awaitable[ScheduleInfo]: ...
    def delete_schedule(self, name: str) -> Awaitable[None]: ...
    def trigger_schedule(self, name: str) -> Awaitable[Fire]: ...
    def backfill_schedule(self, name: str, start: Instant, end: Instant) -> Awaitable[BackfillReport]: ...

@dataclass(frozen=True)
class GroupSnapshot:
    labels: Dict[str, str]
    capacity: int
    busy: int
    workers: int = ...

@dataclass(frozen=True)
class Demand:
    labels: Dict[str, str]
    waiting: int
    reason: Optional[str] = ...

@dataclass(frozen=True)
class Autoscale:
    desired: int
    min: int
    max: int

@dataclass(frozen=True)
class PoolSnapshot:
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
    def group(self, labels: Optional[Dict[str, str]] = ...) -> Optional[GroupSnapshot]: ...

@dataclass(frozen=True)
class WorkerInfo:
    id: str
    pool: str
    labels: Dict[str, str]
    slots: int
    busy: int
    last_seen: int
    draining: bool = ...

@dataclass(frozen=True)
class Snapshot:
    pools: List[PoolSnapshot]
    workers: List[WorkerInfo] = ...
    leader: Optional[Dict[str, Any]] = ...
    def pool(self, name: str) -> Optional[PoolSnapshot]: ...
    def to_table(self) -> str: ...
    def to_dict(self) -> Dict[str, Any]: ...

class TaskHandle:
    id: int
    def __await__(self) -> Generator[Any, None, "TaskHandle"]: ...
    def wait(self) -> "asyncio.Future[Outcome]": ...
    def cancel(self) -> None: ...

class Scheduler(ScheduleCalls):
    def __init__(
        self,
        *,
        max_payload_bytes: Optional[int] = ...,
        retain_finished: Optional[int] = ...,
        threads: Optional[int] = ...,
        telemetry: bool = ...,
    ) -> None: ...
    def set_capacity(self, pool: str, slots: int) -> None: ...
    def set_group_capacity(self, pool: str, labels: Labels, slots: int) -> None: ...
    def configure_pool(
        self,
        pool: str,
        *,
        max_attempts: int = ...,
        urgency_window: Duration = ...,
        max_bypass: int = ...,
        reservation_lead: Duration = ...,
        on_miss: str = ...,
        autoscale_min: int = ...,
        autoscale_max: int = ...,
        backoff: Tuple[Duration, Duration] = ...,
        fairness: Dict[str, int] = ...,
        quotas: List[Dict[str, Any]] = ...,
        preemption: Literal["off", "priority"] = ...,
        preemption_grace: Duration = ...,
    ) -> None: ...
    def executor(self, pool: str) -> Callable[[F], F]: ...
    def submit(
        self,
        payload: Payload,
        *,
        pool: str = ...,
        labels: Optional[Labels] = ...,
        priority: Optional[int] = ...,
        deadline: Optional[Time] = ...,
        start_at: Optional[Time] = ...,
        tolerance: Optional[Duration] = ...,
        max_attempts: Optional[int] = ...,
        idempotency_key: Optional[str] = ...,
        attempt_timeout: Optional[Duration] = ...,
        est_runtime: Optional[Duration] = ...,
        backoff: Optional[Tuple[Duration, Duration]] = ...,
        fairness_key: Optional[str] = ...,
        fairness_weight: Optional[int] = ...,
        concurrency_key: Optional[str] = ...,
        concurrency_limit: Optional[int] = ...,
        concurrency_policy: Optional[ConcurrencyPolicy] = ...,
        preemptible: Optional[bool] = ...,
    ) -> TaskHandle: ...
    def cancel(self, task: Union[int, TaskHandle]) -> None: ...
    def task(self, task_id: int) -> Optional[TaskStatus]: ...
    def wait(self, task_id: int) -> "asyncio.Future[Outcome]": ...
    def snapshot(self) -> Snapshot: ...
    def close(self) -> None: ...

class Worker:
    draining: bool
    def __init__(
        self,
        nats_url: str,
        *,
        pool: str = ...,
        labels: Optional[Labels] = ...,
        slots: int = ...,
        token: Optional[str] = ...,
        nkey_seed: Optional[str] = ...,
        id: Optional[str] = ...,
        grace: Optional[Duration] = ...,
        prefix: Optional[str] = ...,
        threads: Optional[int] = ...,
    ) -> None: ...
    @property
    def id(self) -> str: ...
    def handler(self, fn: F) -> F: ...
    async def run(self) -> None: ...
    def stop(self) -> None: ...

class Client(ScheduleCalls):
    url: str
    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = ...,
        token_env: Optional[str] = ...,
        nkey_seed: Optional[str] = ...,
        nats_token: Optional[str] = ...,
        prefix: Optional[str] = ...,
        request_timeout: Optional[Duration] = ...,
    ) -> None: ...
    async def connect(self) -> "Client": ...
    async def __aenter__(self) -> "Client": ...
    async def __aexit__(self, *exc: Any) -> None: ...
    async def submit(
        self,
        payload: Payload,
        *,
        pool: str = ...,
        labels: Optional[Labels] = ...,
        priority: Optional[int] = ...,
        deadline: Optional[Time] = ...,
        start_at: Optional[Time] = ...,
        tolerance: Optional[Duration] = ...,
        max_attempts: Optional[int] = ...,
        idempotency_key: Optional[str] = ...,
        attempt_timeout: Optional[Duration] = ...,
        est_runtime: Optional[Duration] = ...,
        backoff: Optional[Tuple[Duration, Duration]] = ...,
        fairness_key: Optional[str] = ...,
        fairness_weight: Optional[int] = ...,
        concurrency_key: Optional[str] = ...,
        concurrency_limit: Optional[int] = ...,
        concurrency_policy: Optional[ConcurrencyPolicy] = ...,
        preemptible: Optional[bool] = ...,
    ) -> int: ...
    async def get(self, task_id: int) -> TaskStatus: ...
    async def cancel(self, task_id: int) -> None: ...
    async def wait(self, task_id: int) -> TaskStatus: ...
    async def snapshot(self) -> Snapshot: ...
def enable_telemetry() -> bool: ...
