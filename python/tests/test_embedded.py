"""The placement rules (SPEC §2) through the Python embedded scheduler: the
same rules `tests/embedded.rs` checks on the Rust one, with real executors
on the asyncio loop, gated by the test."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone

import pytest

import cronoq
from conftest import Gates, eventually, gated_scheduler

GPU = {"gpu": "a100"}


async def test_unlabeled_task_prefers_unlabeled_group_then_takes_any_free_slot(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_group_capacity("default", GPU, 1)
    sched.set_capacity("default", 1)

    first = await sched.submit(b"first")
    await eventually("first starts", lambda: "first" in gates.started())
    assert gates.starts[0].group == {}
    assert gates.starts[0].attempt == 1
    assert gates.starts[0].task_id == first.id
    snap = sched.snapshot()
    assert snap.pool("default").group({}).busy == 1
    assert snap.pool("default").group(GPU).busy == 0

    # The unlabeled group is full: an unlabeled task takes the GPU slot
    # rather than wait.
    second = await sched.submit("second")
    await eventually("second starts", lambda: "second" in gates.started())
    assert gates.where("second") == GPU

    gates.release("first", "second")
    a, b = await asyncio.gather(first.wait(), second.wait())
    assert a.ok and b.ok
    assert a.group == {} and a.output == b"first done"
    assert b.group == GPU


async def test_labeled_task_runs_only_in_a_matching_group(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 2)
    sched.set_group_capacity("default", {"gpu": "h100"}, 1)
    eu_a100 = {"gpu": "a100", "zone": "eu"}
    sched.set_group_capacity("default", eu_a100, 1)

    # A group carrying more labels than required matches.
    a = await sched.submit(b"a", labels=GPU)
    await eventually("a starts", lambda: "a" in gates.started())
    assert gates.where("a") == eu_a100

    # Its only matching group is busy: b waits although the unlabeled and
    # h100 groups have free slots (no head-of-line blocking for c).
    b = await sched.submit(b"b", labels=GPU)
    c = await sched.submit(b"c", labels="gpu=h100")
    await eventually("c starts", lambda: "c" in gates.started())
    assert gates.where("c") == {"gpu": "h100"}
    assert "b" not in gates.started()
    status = sched.task(b.id)
    assert status.state == "queued" and status.reason == "groups_full"
    snap = sched.snapshot()
    assert snap.pool("default").group({}).busy == 0
    assert [(d.labels, d.waiting) for d in snap.pool("default").demand] == [(GPU, 1)]

    gates.release("a")
    await eventually("b starts", lambda: "b" in gates.started())
    assert gates.where("b") == eu_a100
    gates.release("b", "c")
    outs = await asyncio.gather(a.wait(), b.wait(), c.wait())
    assert [o.group for o in outs] == [eu_a100, eu_a100, {"gpu": "h100"}]


async def test_labeled_task_prefers_the_least_specialized_matching_group(gates: Gates):
    sched = gated_scheduler(gates)
    eu_a100 = {"gpu": "a100", "zone": "eu"}
    sched.set_group_capacity("default", eu_a100, 1)  # appears first
    sched.set_group_capacity("default", GPU, 1)
    sched.set_capacity("default", 1)
    first = await sched.submit(b"first", labels=GPU)
    await eventually("first starts", lambda: "first" in gates.started())
    assert gates.where("first") == GPU  # fewest labels among the matching groups
    second = await sched.submit(b"second", labels=GPU)
    await eventually("second starts", lambda: "second" in gates.started())
    assert gates.where("second") == eu_a100  # the rarer group only once GPU is full
    gates.release("first", "second")
    assert [(await h.wait()).group for h in (first, second)] == [GPU, eu_a100]


async def test_no_head_of_line_blocking(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    sched.set_group_capacity("default", GPU, 1)
    hold = await sched.submit(b"hold", labels=GPU)
    await eventually("hold starts", lambda: "hold" in gates.started())
    blocked = await sched.submit(b"blocked", labels=GPU)
    later = await sched.submit(b"later")
    await eventually("later starts", lambda: "later" in gates.started())
    assert "blocked" not in gates.started()
    gates.release("hold", "later", "blocked")
    for h in (hold, later, blocked):
        assert (await h.wait()).ok


async def test_task_for_labels_nobody_has_waits_until_a_matching_group_appears(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    tpu = {"tpu": "v5"}
    h = await sched.submit(b"t", labels=tpu)
    status = sched.task(h.id)
    assert status.state == "queued"
    assert status.reason == "no_group_matches"
    assert status.attempts == []
    pool = sched.snapshot().pool("default")
    assert (pool.waiting, pool.busy, pool.autoscale.desired) == (1, 0, 1)
    assert [(d.labels, d.waiting) for d in pool.demand] == [(tpu, 1)]
    # Other work goes on meanwhile; t is never dropped.
    other = await sched.submit(b"other")
    gates.release("other")
    assert (await other.wait()).ok
    assert sched.task(h.id).state == "queued"

    sched.set_group_capacity("default", tpu, 1)
    await eventually("t starts", lambda: "t" in gates.started())
    assert gates.where("t") == tpu
    assert sched.snapshot().pool("default").demand == []
    gates.release("t")
    out = await h.wait()
    assert out.ok and out.group == tpu


async def test_freed_labeled_slot_goes_to_labeled_waiter_before_unlabeled_one(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_group_capacity("default", GPU, 1)
    x = await sched.submit(b"x", labels=GPU)
    await eventually("x starts", lambda: "x" in gates.started())
    cpu = await sched.submit(b"cpu")
    need = await sched.submit(b"need", labels=GPU)
    gates.release("x")
    await eventually("need starts", lambda: "need" in gates.started())
    assert "cpu" not in gates.started(), "rule 5(b): need before submission order"
    gates.release("need", "cpu")
    for h in (x, need, cpu):
        assert (await h.wait()).ok
    assert gates.started() == ["x", "need", "cpu"]


async def test_waiters_run_by_priority_then_submission_order(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    handles = [await sched.submit(b"first")]
    await eventually("first starts", lambda: "first" in gates.started())
    for name, priority in [("low", 0), ("high", 5), ("mid", 1), ("low2", 0)]:
        handles.append(await sched.submit(name, priority=priority))
        gates.release(name)
    gates.release("first")
    for h in handles:
        assert (await h.wait()).ok
    assert gates.started() == ["first", "high", "mid", "low", "low2"]


async def test_urgent_deadline_goes_before_priority(gates: Gates):
    sched = gated_scheduler(gates)
    sched.configure_pool("default", urgency_window=timedelta(hours=1), backoff=(0.01, 0.05))
    sched.set_capacity("default", 1)
    handles = [await sched.submit(b"first")]
    await eventually("first starts", lambda: "first" in gates.started())
    handles.append(await sched.submit(b"important", priority=9))
    # Within the urgency window: urgent, ahead of every non-urgent task.
    handles.append(await sched.submit(b"urgent", deadline=timedelta(minutes=30)))
    gates.release("first", "important", "urgent")
    for h in handles:
        assert (await h.wait()).ok
    assert gates.started() == ["first", "urgent", "important"]


async def test_deadline_never_cancels_but_a_late_finish_is_counted(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    late = await sched.submit(b"late", deadline=datetime.now(timezone.utc) - timedelta(seconds=1))
    gates.release("late")
    out = await late.wait()
    assert out.state == "succeeded"
    assert out.deadline_missed
    assert sched.task(out.id).deadline_missed

    # A deadline that passes while the task runs does not stop it either.
    deadline = datetime.now(timezone.utc) + timedelta(milliseconds=50)
    running = await sched.submit(b"running", deadline=deadline)
    await eventually("running starts", lambda: "running" in gates.started())
    await eventually("the deadline passes", lambda: datetime.now(timezone.utc) > deadline + timedelta(milliseconds=10))
    assert sched.task(running.id).state == "running"
    gates.release("running")
    out = await running.wait()
    assert out.ok and out.deadline_missed

    on_time = await sched.submit(b"on time", deadline=3600)
    gates.release("on time")
    assert not (await on_time.wait()).deadline_missed
    assert sched.snapshot().pool("default").deadline_missed == 2


async def test_exception_is_a_failed_attempt_retried_with_its_traceback(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    gates.fail_until["flaky"] = 2
    gates.release("flaky")
    out = await (await sched.submit(b"flaky", max_attempts=3)).wait()
    assert out.ok and out.output == b"flaky done"
    assert [a.outcome for a in out.attempts] == ["failed", "failed", "succeeded"]
    error = out.attempts[0].error
    assert "Traceback (most recent call last)" in error
    assert "RuntimeError: flaky failed on purpose" in error
    assert [s.attempt for s in gates.starts] == [1, 2, 3]

    gates.fail_until["doomed"] = 99
    gates.release("doomed")
    out = await (await sched.submit(b"doomed", max_attempts=2)).wait()
    assert out.state == "failed"
    assert len(out.attempts) == 2
    assert "doomed failed on purpose" in out.error


async def test_permanent_error_fails_at_once_and_bad_output_is_a_failed_attempt():
    sched = cronoq.Scheduler()
    sched.set_capacity("default", 1)
    calls = []

    @sched.executor("default")
    async def run(ctx: cronoq.TaskContext, payload: bytes):
        calls.append(payload)
        if payload == b"permanent":
            raise cronoq.PermanentError("bad payload")
        return 42  # not bytes, str or None

    out = await (await sched.submit(b"permanent", max_attempts=5)).wait()
    assert out.state == "failed" and len(out.attempts) == 1
    assert "PermanentError: bad payload" in out.error
    out = await (await sched.submit(b"int", max_attempts=2, backoff=(0.01, 0.01))).wait()
    assert out.state == "failed" and len(out.attempts) == 2
    assert "must be bytes or str, not int" in out.error


async def test_each_attempt_is_placed_afresh_and_sees_its_group(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    hold = await sched.submit(b"hold")
    await eventually("hold starts", lambda: "hold" in gates.started())
    sched.set_group_capacity("default", GPU, 1)
    gates.fail_until["moving"] = 1
    moving = await sched.submit(b"moving")
    await eventually("moving starts", lambda: "moving" in gates.started())
    assert gates.where("moving") == GPU
    gates.release("hold")
    assert (await hold.wait()).ok
    gates.release("moving")
    out = await moving.wait()
    assert out.ok
    assert [a.group for a in out.attempts][0] == GPU
    assert [s.attempt for s in gates.starts if s.name == "moving"] == [1, 2]


async def test_cancel_of_a_waiting_task_ends_it_at_once(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    hold = await sched.submit(b"hold")
    await eventually("hold starts", lambda: "hold" in gates.started())
    waiting = await sched.submit(b"waiting")
    sched.cancel(waiting.id)
    out = await waiting.wait()
    assert out.state == "cancelled" and out.attempts == []
    assert sched.snapshot().pool("default").waiting == 0
    with pytest.raises(cronoq.FailedPrecondition):
        sched.cancel(waiting.id)
    with pytest.raises(cronoq.NotFound):
        sched.cancel(12345)
    gates.release("hold")
    assert (await hold.wait()).ok
    assert gates.started() == ["hold"]


async def test_cancel_of_a_running_task_cancels_its_coroutine_and_frees_the_slot(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    running = await sched.submit(b"running")
    await eventually("running starts", lambda: "running" in gates.started())
    next_ = await sched.submit(b"next")
    running.cancel()
    out = await running.wait()
    assert out.state == "cancelled"
    assert [a.outcome for a in out.attempts] == ["cancelled"]
    await eventually("the coroutine is cancelled", lambda: gates.cancelled == ["running"])
    await eventually("next starts", lambda: "next" in gates.started())
    gates.release("next")
    assert (await next_.wait()).ok
    await eventually("busy back to 0", lambda: sched.snapshot().pool("default").busy == 0)


async def test_plain_functions_run_in_a_thread_pool():
    sched = cronoq.Scheduler(threads=2)
    sched.set_capacity("cpu", 2)
    loop_thread = threading.get_ident()
    gate = threading.Event()
    seen = []

    @sched.executor("cpu")
    def crunch(ctx: cronoq.TaskContext, payload: bytes) -> str:
        seen.append(threading.get_ident())
        if payload == b"wait":
            assert gate.wait(30)
        if payload == b"boom":
            raise ValueError("no")
        return payload.decode().upper()

    waiting = await sched.submit(b"wait", pool="cpu")
    # The loop is free while a plain executor blocks.
    out = await (await sched.submit(b"hi", pool="cpu")).wait()
    assert out.output == b"HI"
    gate.set()
    assert (await waiting.wait()).output == b"WAIT"
    assert loop_thread not in seen
    out = await (await sched.submit(b"boom", pool="cpu", max_attempts=1)).wait()
    assert out.state == "failed" and "ValueError: no" in out.error


async def test_fixed_start_runs_at_start_at_not_before(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    start_at = datetime.now(timezone.utc) + timedelta(milliseconds=300)
    h = await sched.submit(b"fixed", start_at=start_at, tolerance=timedelta(seconds=30))
    status = sched.task(h.id)
    assert status.state == "scheduled"
    assert sched.snapshot().pool("default").scheduled == 1
    await eventually("fixed starts", lambda: "fixed" in gates.started())
    gates.release("fixed")
    out = await h.wait()
    assert out.ok
    assert out.attempts[0].started_at >= start_at - timedelta(milliseconds=1)


async def test_same_idempotency_key_while_live_returns_the_same_task(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    a = await sched.submit(b"keyed", idempotency_key="k1")
    b = await sched.submit(b"keyed", idempotency_key="k1")
    assert a.id == b.id
    gates.release("keyed")
    x, y = await asyncio.gather(a.wait(), b.wait())
    assert x.ok and y.ok and x.id == y.id
    # Waiting twice on one handle, or by id after the end, still answers.
    assert (await a.wait()).id == a.id
    assert (await sched.wait(a.id)).ok


async def test_snapshot_shows_groups_capacity_busy_and_a_table(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("inference", 4)
    sched.set_group_capacity("inference", GPU, 2)
    sched.executor("inference")(gates.run)
    h = await sched.submit(b"job", pool="inference", labels=GPU)
    await eventually("job starts", lambda: "job" in gates.started())
    snap = sched.snapshot()
    pool = snap.pool("inference")
    assert (pool.capacity, pool.busy) == (6, 1)
    assert [(g.labels, g.capacity, g.busy) for g in pool.groups] == [({}, 4, 0), (GPU, 2, 1)]
    table = snap.to_table()
    assert "pool inference" in table and "gpu=a100" in table
    assert "inference" in [p["name"] for p in snap.to_dict()["pools"]]
    gates.release("job")
    assert (await h.wait()).ok


def test_a_scheduler_built_outside_a_loop_follows_the_loop_that_uses_it():
    sched = cronoq.Scheduler()
    sched.set_capacity("default", 2)

    @sched.executor("default")
    async def run(ctx: cronoq.TaskContext, payload: bytes) -> bytes:
        await asyncio.sleep(0)
        return payload * 2

    # Submitted before any loop runs: it waits for one.
    early = sched.submit(b"early")

    async def use(payload: bytes) -> bytes:
        outcome = await (await sched.submit(payload)).wait()
        return outcome.output

    assert asyncio.run(use(b"a")) == b"aa"
    assert asyncio.run(use(b"b")) == b"bb"  # a second loop: the scheduler moves there

    async def wait_early() -> bytes:
        return (await early.wait()).output

    assert asyncio.run(wait_early()) == b"earlyearly"
    sched.close()


async def test_attempt_timeout_cancels_the_coroutine_counts_as_lost_and_retries(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    h = await sched.submit(b"slow", attempt_timeout=0.05, max_attempts=2)
    await eventually("both attempts are cancelled", lambda: gates.cancelled == ["slow", "slow"])
    out = await h.wait()
    assert out.state == "failed"
    assert [a.outcome for a in out.attempts] == ["lost", "lost"]
    assert [s.attempt for s in gates.starts] == [1, 2]
    await eventually("busy back to 0", lambda: sched.snapshot().pool("default").busy == 0)
