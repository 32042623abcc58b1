"""Schedules (cron expressions and intervals that submit a task per tick):
the result classes, and the calls that :class:`cronoq.Scheduler` and
:class:`cronoq.Client` share.

The native half (``python/src/schedules.rs``) converts the arguments,
validates the schedule at the call (a bad one raises
:class:`cronoq.InvalidArgument` before anything is sent) and answers the
API's JSON; here it becomes these dataclasses. Instants are aware
``datetime`` objects in UTC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Dict, List, Optional, TypeVar

T = TypeVar("T")


def _at(ms: Optional[int]) -> Optional[datetime]:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _ats(values: Optional[List[int]]) -> List[datetime]:
    return [datetime.fromtimestamp(ms / 1000, tz=timezone.utc) for ms in values or []]


@dataclass(frozen=True)
class Fire:
    """One run a schedule started: its tick, its task and how it ended."""

    tick: datetime
    """The scheduled instant (for a trigger, when it was asked)."""
    fired_at: datetime
    kind: str
    """``"tick"``, ``"trigger"`` or ``"backfill"``."""
    task: Optional[int] = None
    """The task's id, once accepted (``None`` if refused: see ``error``)."""
    outcome: Optional[str] = None
    """The task's final state once it ended (``"succeeded"``, ...); ``None`` while it runs."""
    error: Optional[str] = None
    """Why the submission was refused, if it was."""

    @classmethod
    def _of(cls, d: Dict[str, Any]) -> "Fire":
        return cls(
            tick=_at(d["tick"]),  # type: ignore[arg-type]
            fired_at=_at(d["fired_at"]),  # type: ignore[arg-type]
            kind=d.get("kind", "tick"),
            task=d.get("task"),
            outcome=d.get("outcome"),
            error=d.get("error"),
        )


@dataclass(frozen=True)
class MissedTicks:
    """Ticks from ``first`` up to (not including) ``until`` passed over without a run."""

    first: datetime
    until: datetime
    reason: str
    """``"too_late"`` (older than the catch-up window) or ``"paused"``."""
    ticks: int


@dataclass(frozen=True)
class ScheduleCounters:
    """Runs started, ticks skipped (overlap) and missed, since creation."""

    fires: int = 0
    skipped: int = 0
    missed: int = 0


@dataclass(frozen=True)
class ScheduleInfo:
    """Everything about one schedule (``GET /v1/schedules/{name}``)."""

    name: str
    cron: Optional[str]
    every: Optional[str]
    tz: Optional[str]
    overlap: str
    paused: bool
    pool: str
    owner: Optional[str]
    created_at: datetime
    next_fires: List[datetime]
    """The next 5 fire instants (tick plus jitter); empty while paused."""
    history: List[Fire]
    """Recent runs, newest first."""
    skipped: List[datetime]
    """Recent ticks skipped by the overlap policy, newest first."""
    missed: List[MissedTicks]
    """Recent ranges of missed ticks, newest first."""
    counters: ScheduleCounters
    spec: Dict[str, Any] = field(default_factory=dict, repr=False)
    """The schedule as created (the JSON of ``POST /v1/schedules``)."""
    state: Dict[str, Any] = field(default_factory=dict, repr=False)
    """The firing state (decided through, last fired, active, buffered)."""

    @classmethod
    def _of(cls, text: str) -> "ScheduleInfo":
        d = json.loads(text)
        spec = d["spec"]
        return cls(
            name=spec["name"],
            cron=spec.get("cron"),
            every=spec.get("every"),
            tz=spec.get("tz"),
            overlap=spec.get("overlap", "allow"),
            paused=d["paused"],
            pool=(spec.get("task") or {}).get("pool") or "default",
            owner=d.get("owner"),
            created_at=_at(d["created_at"]),  # type: ignore[arg-type]
            next_fires=_ats(d.get("next_fires")),
            history=[Fire._of(f) for f in d.get("history") or []],
            skipped=_ats(d.get("skipped")),
            missed=[
                MissedTicks(
                    first=_at(m["first"]),  # type: ignore[arg-type]
                    until=_at(m["until"]),  # type: ignore[arg-type]
                    reason=m["reason"],
                    ticks=m["ticks"],
                )
                for m in d.get("missed") or []
            ],
            counters=ScheduleCounters(**d.get("counters", {})),
            spec=spec,
            state=d.get("state") or {},
        )


@dataclass(frozen=True)
class ScheduleEntry:
    """One line of the schedule list: cadence, next fire, last run."""

    name: str
    cron: Optional[str]
    every: Optional[str]
    tz: Optional[str]
    overlap: str
    pool: str
    paused: bool
    owner: Optional[str]
    next_fire: Optional[datetime]
    """``None`` while paused."""
    last: Optional[Fire]
    counters: ScheduleCounters

    @classmethod
    def _list(cls, text: str) -> List["ScheduleEntry"]:
        return [
            cls(
                name=e["name"],
                cron=e.get("cron"),
                every=e.get("every"),
                tz=e.get("tz"),
                overlap=e.get("overlap", "allow"),
                pool=e.get("pool", "default"),
                paused=e["paused"],
                owner=e.get("owner"),
                next_fire=_at(e.get("next_fire")),
                last=Fire._of(e["last"]) if e.get("last") else None,
                counters=ScheduleCounters(**e.get("counters", {})),
            )
            for e in json.loads(text)
        ]


@dataclass(frozen=True)
class BackfillReport:
    """What a backfill did: the runs it started and the ticks it skipped."""

    fired: List[Fire]
    skipped: List[datetime]

    @classmethod
    def _of(cls, text: str) -> "BackfillReport":
        d = json.loads(text)
        return cls(fired=[Fire._of(f) for f in d.get("fired") or []], skipped=_ats(d.get("skipped")))


async def _then(pending: Awaitable[Any], convert: Callable[[Any], T]) -> T:
    return convert(await pending)


class ScheduleCalls:
    """The schedule calls of :class:`cronoq.Scheduler` and :class:`cronoq.Client`.

    Each converts and checks its arguments at the call (raising
    :class:`cronoq.InvalidArgument` then, changing nothing) and returns an
    awaitable of the answer.
    """

    def schedule(self, name: str, **options: Any) -> Awaitable[ScheduleInfo]:
        """Creates a schedule: a task submitted once per tick.

        ``cron`` (5 fields, 6 with seconds first, or ``@hourly``/``@daily``/
        ``@weekly``/``@monthly``/``@yearly``) or ``every`` (``"30s"``, a
        ``timedelta`` or seconds; at least 1 s); ``tz`` (an IANA zone for
        ``cron``, default UTC); ``overlap`` (``"allow"``, ``"skip"``,
        ``"buffer_one"``, ``"cancel_previous"``); ``catchup_window``
        (default 1 minute); ``jitter``; ``paused``. The task of each tick:
        ``payload``, ``pool``, ``labels``, ``priority``, ``max_attempts``,
        ``attempt_timeout``, ``deadline`` (a duration after the tick), named
        as in ``submit``. A taken name raises :class:`cronoq.AlreadyExists`.
        """
        return self._call(lambda s: s.create(name, **options), ScheduleInfo._of)

    def list_schedules(self) -> Awaitable[List[ScheduleEntry]]:
        """Every schedule, by name."""
        return self._call(lambda s: s.list(), ScheduleEntry._list)

    def get_schedule(self, name: str) -> Awaitable[ScheduleInfo]:
        """One schedule (:class:`cronoq.NotFound` if there is none by that name)."""
        return self._call(lambda s: s.get(name), ScheduleInfo._of)

    def pause_schedule(self, name: str) -> Awaitable[ScheduleInfo]:
        """Pauses a schedule: its ticks pass without runs."""
        return self._call(lambda s: s.pause(name), ScheduleInfo._of)

    def resume_schedule(self, name: str) -> Awaitable[ScheduleInfo]:
        """Resumes a schedule from now."""
        return self._call(lambda s: s.resume(name), ScheduleInfo._of)

    def delete_schedule(self, name: str) -> Awaitable[None]:
        """Deletes a schedule; its runs already started go on."""
        return self._call(lambda s: s.delete(name), lambda _: None)

    def trigger_schedule(self, name: str) -> Awaitable[Fire]:
        """Runs the schedule's task once now, outside the tick sequence."""
        return self._call(lambda s: s.trigger(name), lambda t: Fire._of(json.loads(t)))

    def backfill_schedule(self, name: str, start: Any, end: Any) -> Awaitable[BackfillReport]:
        """Fires each tick from ``start`` to ``end`` (inclusive; ``datetime``
        or RFC 3339 text), obeying the overlap policy."""
        return self._call(lambda s: s.backfill(name, start, end), BackfillReport._of)

    def _call(
        self, call: Callable[[Any], Awaitable[Any]], convert: Callable[[Any], T]
    ) -> Awaitable[T]:
        """Makes ``call`` on the native schedule calls; ``convert`` reads its answer."""
        raise NotImplementedError
