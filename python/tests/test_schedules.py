"""Schedules from Python (issue 23): ``sched.schedule(...)`` and the other
schedule calls on the embedded :class:`cronoq.Scheduler` and on
:class:`cronoq.Client` (HTTP and NATS, against a real ``cronoq server``).

A bad schedule raises :class:`cronoq.InvalidArgument` (a taken name
:class:`cronoq.AlreadyExists`, an unknown one :class:`cronoq.NotFound`)
and changes nothing. Nothing waits on the clock: every check polls with a
deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List

import pytest

import cronoq
from conftest import TOKENS, Proc, cronoq_binary, eventually, free_port

BAD: List[Dict[str, Any]] = [
    dict(cron="61 * * * *"),
    dict(cron="0 0 30 2 *"),
    dict(cron="@daily", tz="Europe/Atlantis"),
    dict(every=0),
    dict(every=0.25),
    dict(every="0s"),
    dict(every="often"),
    dict(cron="@daily", every="1m"),
    dict(),
    dict(every="1m", tz="UTC"),
    dict(every="1m", overlap="sometimes"),
    dict(every="1m", catchup_window=timedelta(days=2)),
    dict(every="1m", jitter="2d"),
    dict(every="1m", pool="no pool"),
    dict(every="1m", labels={"gpu": ""}),
    dict(every="1m", labels="gpu"),
    dict(every="1m", priority="high"),
    dict(every="1m", max_attempts=0),
    dict(every="1m", attempt_timeout=-1),
    dict(every="1m", payload=12),
]

MESSAGES = {
    0: "invalid cron expression",
    1: "never fires",
    2: "unknown time zone",
    3: "below the minimum of 1s",
    4: "below the minimum of 1s",
    9: "tz applies to cron only",
    10: "overlap must be",
}


def scheduler_with_runs(runs: List[Any]) -> cronoq.Scheduler:
    sched = cronoq.Scheduler()
    sched.set_capacity("default", 4)

    @sched.executor("default")
    async def run(ctx: cronoq.TaskContext, payload: bytes) -> bytes:
        runs.append((ctx.task_id, payload))
        return payload

    return sched


async def test_a_bad_schedule_raises_invalid_argument_at_the_call():
    sched = scheduler_with_runs([])
    for i, options in enumerate(BAD):
        with pytest.raises(cronoq.InvalidArgument) as err:
            sched.schedule("nightly", **options)  # raises before any await
        assert err.value.code == "INVALID_ARGUMENT", options
        if i in MESSAGES:
            assert MESSAGES[i] in str(err.value), (options, str(err.value))
    for name in ["", "a.b", "a b", "x" * 65]:
        with pytest.raises(cronoq.InvalidArgument):
            sched.schedule(name, every="1m")
        with pytest.raises(cronoq.InvalidArgument):
            sched.get_schedule(name)
    with pytest.raises(cronoq.InvalidArgument, match="not an RFC 3339 time"):
        sched.backfill_schedule("nightly", "yesterday", "2026-01-01T00:00:00Z")
    with pytest.raises(cronoq.InvalidArgument, match="from is after to"):
        sched.backfill_schedule(
            "nightly", "2026-01-02T00:00:00Z", datetime(2026, 1, 1, tzinfo=timezone.utc)
        )
    sched.close()


async def test_an_embedded_schedule_fires_and_is_paused_triggered_backfilled_and_deleted():
    runs: List[Any] = []
    sched = scheduler_with_runs(runs)
    info = await sched.schedule(
        "tick",
        every=timedelta(seconds=1),
        overlap="skip",
        payload=b"beat",
        labels={},
        priority=2,
        max_attempts=2,
        attempt_timeout=30,
        deadline="1m",
    )
    assert (info.name, info.every, info.overlap, info.pool, info.paused) == (
        "tick", "1000ms", "skip", "default", False
    )
    assert len(info.next_fires) == 5 and info.next_fires == sorted(info.next_fires)
    assert all(t.tzinfo is timezone.utc for t in info.next_fires)

    # Ticks fire: two runs, each recorded with its task and outcome.
    info = await eventually(
        "two fires that succeeded",
        lambda: _with(sched.get_schedule("tick"), lambda i: sum(
            1 for f in i.history if f.outcome == "succeeded") >= 2),
    )
    fired = [f for f in info.history if f.outcome == "succeeded"]
    assert {f.task for f in fired} <= {task for task, _ in runs}
    assert all(f.kind == "tick" and f.tick.microsecond == 0 for f in fired)
    assert {p for _, p in runs} == {b"beat"}
    assert info.counters.fires >= 2

    entries = await sched.list_schedules()
    assert [e.name for e in entries] == ["tick"]
    assert entries[0].last is not None and entries[0].next_fire is not None

    # A taken name, an unknown one: refused, nothing changes.
    with pytest.raises(cronoq.AlreadyExists):
        await sched.schedule("tick", every="5m")
    with pytest.raises(cronoq.NotFound):
        await sched.get_schedule("nope")
    assert (await sched.get_schedule("tick")).every == "1000ms"

    paused = await sched.pause_schedule("tick")
    assert paused.paused and paused.next_fires == []
    fire = await sched.trigger_schedule("tick")
    assert fire.kind == "trigger" and fire.task is not None
    await eventually("the triggered run", lambda: any(t == fire.task for t, _ in runs))

    now = datetime.now(timezone.utc).replace(microsecond=0)
    report = await sched.backfill_schedule("tick", now - timedelta(seconds=3), now - timedelta(seconds=2))
    # The range holds two ticks: each fired, or skipped by the policy.
    assert len(report.fired) + len(report.skipped) == 2
    assert all(f.kind == "backfill" for f in report.fired)

    resumed = await sched.resume_schedule("tick")
    assert not resumed.paused and len(resumed.next_fires) == 5

    await sched.delete_schedule("tick")
    assert await sched.list_schedules() == []
    with pytest.raises(cronoq.NotFound):
        await sched.delete_schedule("tick")
    sched.close()


async def _with(pending: Any, check: Any) -> Any:
    value = await pending
    return value if check(value) else None


async def test_a_client_manages_schedules_over_http(tmp_path):
    """``Client`` over HTTP against ``cronoq dev --embedded``: the same calls
    and answers as the embedded scheduler's, the scheduler's refusals with
    their classes."""
    port = free_port()
    proc = Proc(
        "dev",
        [cronoq_binary(), "dev", "--embedded", "--work", "10ms", "--http", f"127.0.0.1:{port}"],
        tmp_path / "dev.log",
    )
    try:
        client = cronoq.Client(f"http://127.0.0.1:{port}", request_timeout=5)

        async def answers() -> bool:
            try:
                await client.snapshot()
                return True
            except cronoq.Unavailable:
                return False

        await eventually("cronoq dev to answer", answers)
        info = await client.schedule(
            "beat", every="1s", overlap="buffer_one", payload="hi", labels="gpu=a100"
        )
        assert (info.every, info.overlap, info.spec["task"]["labels"]) == (
            "1s", "buffer_one", {"gpu": "a100"}
        )
        await eventually(
            "a run of beat that succeeded",
            lambda: _with(client.get_schedule("beat"), lambda i: any(
                f.outcome == "succeeded" for f in i.history)),
        )
        with pytest.raises(cronoq.AlreadyExists):
            await client.schedule("beat", cron="@daily")
        with pytest.raises(cronoq.InvalidArgument, match="never fires"):
            await client.schedule("feb30", cron="0 0 30 2 *")
        with pytest.raises(cronoq.NotFound):
            await client.trigger_schedule("nope")
        assert [e.name for e in await client.list_schedules()] == ["beat"]
        fire = await client.trigger_schedule("beat")
        assert fire.kind == "trigger" and (await client.wait(fire.task)).ok
        assert (await client.pause_schedule("beat")).paused
        await client.delete_schedule("beat")
        assert await client.list_schedules() == []
    finally:
        proc.stop()


async def test_a_client_manages_schedules_over_nats(cluster):
    """``Client`` over NATS against a real ``cronoq server``: the calls reach
    the leader's ``P.api.schedule_*`` verbs; its refusals keep their
    classes. No worker runs: a fired task stays queued."""
    client = cronoq.Client(cluster.nats_url, request_timeout=10)
    info = await client.schedule("hourly", every="1h", payload=b"report", priority=2)
    assert (info.name, info.every, len(info.next_fires)) == ("hourly", "1h", 5)
    with pytest.raises(cronoq.AlreadyExists):
        await client.schedule("hourly", cron="@daily")
    with pytest.raises(cronoq.InvalidArgument, match="never fires"):
        await client.schedule("feb30", cron="0 0 30 2 *")
    with pytest.raises(cronoq.NotFound):
        await client.get_schedule("nope")
    assert [e.name for e in await client.list_schedules()] == ["hourly"]
    assert (await client.get_schedule("hourly")).next_fires == info.next_fires
    assert (await client.pause_schedule("hourly")).paused
    assert not (await client.resume_schedule("hourly")).paused
    fire = await client.trigger_schedule("hourly")
    assert fire.kind == "trigger" and fire.task
    status = await eventually("the fired task to be known", lambda: client.get(fire.task))
    assert status.state == "queued"
    # The task names the schedule that fired it and the tick (a trigger's
    # tick is the instant it was asked).
    assert status.schedule == "hourly"
    assert status.scheduled_at is not None
    await client.delete_schedule("hourly")
    assert await client.list_schedules() == []


async def test_credentials_decide_schedules_over_nats_and_http(auth_cluster):
    """With ``[auth] required`` and no storage key, over NATS and over HTTP
    (which calls the leader over NATS as the caller's token): a reader
    lists but may not create (:class:`cronoq.PermissionDenied`), no token
    is :class:`cronoq.Unauthenticated`, and even an admin's create is
    refused (:class:`cronoq.FailedPrecondition`: the leader could not
    attribute the fires)."""
    for url in [auth_cluster.nats_url, auth_cluster.http_url]:
        reader = cronoq.Client(url, token=TOKENS["CRONOQ_PY_READER"], request_timeout=10)
        admin = cronoq.Client(url, token=TOKENS["CRONOQ_PY_ADMIN"], request_timeout=10)
        anonymous = cronoq.Client(url, request_timeout=10)
        assert await reader.list_schedules() == [], url
        with pytest.raises(cronoq.PermissionDenied):
            await reader.schedule("r", every="1h")
        with pytest.raises(cronoq.Unauthenticated):
            await anonymous.list_schedules()
        with pytest.raises(cronoq.FailedPrecondition, match="storage"):
            await admin.schedule("a", every="1h")
        assert await admin.list_schedules() == [], url
