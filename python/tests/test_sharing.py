"""Sharing a fleet (SPEC §9, issue 36) through the Python embedded
scheduler: the submit keywords and ``configure_pool`` settings reach the
core; a preempted executor sees its cancellation and the attempt ends
``preempted`` without counting; concurrency and quota wait reasons; bad
values raise ``InvalidArgument`` and change nothing."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from conftest import Gates, eventually, gated_scheduler


async def test_a_preempted_executor_is_cancelled_and_its_attempt_does_not_count():
    sched = cronoq.Scheduler()
    sched.configure_pool("default", preemption="priority", preemption_grace=5)
    sched.set_capacity("default", 1)
    cancelled = []
    started = []

    @sched.executor("default")
    async def run(ctx, payload):
        started.append((payload, ctx.attempt))
        if payload == b"low" and ctx.attempt == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(ctx.task_id)
                raise
        return payload

    low = await sched.submit(b"low", max_attempts=1)
    await eventually("low starts", lambda: started == [(b"low", 1)])
    high = await sched.submit(b"high", priority=5)
    assert (await high.wait()).ok
    out = await low.wait()
    assert out.ok, out.error
    assert [a.outcome for a in out.attempts] == ["preempted", "succeeded"]
    await eventually("the executor saw its cancellation", lambda: cancelled == [low.id])


async def test_concurrency_keywords_reach_the_core(gates: Gates):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 4)
    first = await sched.submit(b"d1", concurrency_key="deploy", concurrency_limit=1)
    await eventually("d1 starts", lambda: "d1" in gates.started())
    second = await sched.submit(b"d2", concurrency_key="deploy", concurrency_policy="queue")
    skipped = await sched.submit(b"d3", concurrency_key="deploy", concurrency_policy="skip")
    assert sched.task(second.id).reason == "concurrency"
    assert sched.task(second.id).reason_key == "deploy"
    assert (await skipped.wait()).state == "cancelled"
    gates.release("d1", "d2")
    assert (await first.wait()).ok and (await second.wait()).ok


async def test_a_key_at_its_quota_waits_with_reason_quota(gates: Gates):
    sched = gated_scheduler(gates)
    sched.configure_pool(
        "default",
        fairness={"team-a": 3},
        quotas=[{"key": "team-b", "labels": {}, "max_running": 1}],
    )
    sched.set_capacity("default", 4)
    b1 = await sched.submit(b"b1", fairness_key="team-b")
    b2 = await sched.submit(b"b2", fairness_key="team-b", fairness_weight=2, preemptible=False)
    a1 = await sched.submit(b"a1", fairness_key="team-a")
    await eventually("b1 and a1 start", lambda: {"b1", "a1"} <= set(gates.started()))
    assert sched.task(b2.id).reason == "quota"
    assert sched.task(b2.id).reason_key == "team-b"
    gates.release("b1", "b2", "a1")
    for h in (b1, b2, a1):
        assert (await h.wait()).ok


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fairness_key": 7},
        {"fairness_weight": "heavy"},
        {"fairness_weight": 0},
        {"concurrency_limit": 0},
        {"concurrency_policy": "sometimes"},
        {"preemptible": "no"},
    ],
)
async def test_bad_sharing_keywords_raise_invalid_argument_and_change_nothing(gates: Gates, kwargs):
    sched = gated_scheduler(gates)
    sched.set_capacity("default", 1)
    with pytest.raises(cronoq.InvalidArgument):
        sched.submit(b"x", **kwargs)
    h = await sched.submit(b"ok")
    assert h.id == 1
    gates.release("ok")
    assert (await h.wait()).ok


@pytest.mark.parametrize(
    "settings",
    [
        {"preemption": "always"},
        {"fairness": {"team-a": 0}},
        {"fairness": ["team-a"]},
        {"quotas": [{"key": "team-b"}]},
    ],
)
def test_bad_pool_sharing_settings_raise_invalid_argument(settings):
    sched = cronoq.Scheduler()
    with pytest.raises(cronoq.InvalidArgument):
        sched.configure_pool("default", **settings)
