"""A Python remote worker and Python clients (NATS and HTTP) against a real
nats-server and `cronoq server` (started per test by the `cluster`
fixture, on free loopback ports)."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from conftest import Cluster, eventually

GPU = {"gpu": "a100"}


async def worker_registered(client: cronoq.Client, worker_id: str) -> bool:
    snap = await client.snapshot()
    return any(w.id == worker_id for w in snap.workers)


async def test_worker_and_clients_over_nats_and_http(cluster: Cluster):
    worker = cronoq.Worker(cluster.nats_url, labels=GPU, slots=2, id="py-gpu", grace=30)
    gate = asyncio.Event()
    seen = []

    @worker.handler
    async def run(ctx: cronoq.TaskContext, payload: bytes) -> bytes:
        seen.append((payload, ctx.attempt, ctx.group, ctx.pool))
        if payload == b"flaky" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        if payload == b"hold":
            await gate.wait()
        return payload + b" on " + ",".join(f"{k}={v}" for k, v in ctx.group.items()).encode()

    running = asyncio.create_task(worker.run())
    nats = cronoq.Client(cluster.nats_url)
    http = cronoq.Client(cluster.http_url)
    try:
        await eventually("the worker registers", lambda: worker_registered(nats, "py-gpu"))

        # Over NATS: a labeled task runs on the labeled worker.
        task_id = await nats.submit(b"hello", labels=GPU)
        status = await nats.wait(task_id)
        assert status.ok and status.state == "succeeded"
        assert status.output == b"hello on gpu=a100"
        assert status.group == GPU
        assert status.attempts[0].worker == "py-gpu"
        assert (await nats.get(task_id)).output == b"hello on gpu=a100"

        # Over HTTP, with the same keyword arguments.
        task_id = await http.submit("via http", priority=3, max_attempts=2)
        status = await http.wait(task_id)
        assert status.ok and status.output == b"via http on gpu=a100"

        # A Python exception is a failed attempt with its traceback; retried.
        task_id = await nats.submit(b"flaky", max_attempts=3)
        status = await nats.wait(task_id)
        assert status.ok
        assert [a.outcome for a in status.attempts] == ["failed", "succeeded"]
        assert "RuntimeError: first attempt fails" in status.attempts[0].error

        # Labels nobody has: it waits (and says why) until cancelled.
        task_id = await nats.submit(b"tpu work", labels={"tpu": "v5"})
        await eventually(
            "it waits for a matching group",
            lambda: _waits_for_labels(nats, task_id),
        )
        snap = await http.snapshot()
        pool = snap.pool("default")
        assert [(d.labels, d.waiting) for d in pool.demand] == [({"tpu": "v5"}, 1)]
        assert pool.group(GPU).capacity == 2
        assert "py-gpu" in [w.id for w in snap.workers]
        assert "gpu=a100" in snap.to_table()
        await nats.cancel(task_id)
        assert (await nats.wait(task_id)).state == "cancelled"

        with pytest.raises(cronoq.NotFound):
            await nats.get(987654)

        # Cancelling run() drains: the running attempt finishes and is
        # reported, then the worker deregisters.
        held = await nats.submit(b"hold")
        await eventually("hold starts", lambda: any(p == b"hold" for p, *_ in seen))
        running.cancel()
        await eventually("the worker drains", lambda: worker.draining)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await running
        status = await nats.wait(held)
        assert status.ok and status.output == b"hold on gpu=a100"
        await eventually(
            "the worker deregisters", lambda: _not(worker_registered(nats, "py-gpu"))
        )
    finally:
        if not running.done():
            worker.stop()
            await asyncio.wait_for(running, 60)


async def test_worker_stop_returns_and_a_client_without_server_is_unavailable(cluster: Cluster):
    worker = cronoq.Worker(cluster.nats_url, id="py-cpu")

    @worker.handler
    def run(ctx, payload):  # a plain function: runs in a thread
        return payload.upper()

    running = asyncio.create_task(worker.run())
    client = cronoq.Client(cluster.nats_url)
    await eventually("the worker registers", lambda: worker_registered(client, "py-cpu"))
    task_id = await client.submit(b"shout", idempotency_key="once")
    assert await client.submit(b"shout", idempotency_key="once") == task_id
    assert (await client.wait(task_id)).output == b"SHOUT"
    worker.stop()
    await asyncio.wait_for(running, 60)  # returns normally

    nobody = cronoq.Client("nats://127.0.0.1:1", request_timeout=1)
    with pytest.raises(cronoq.Unavailable):
        await nobody.snapshot()


async def _waits_for_labels(client: cronoq.Client, task_id: int):
    """The task's (state, reason) once it waits because nobody has its labels."""
    try:
        status = await client.get(task_id)
    except cronoq.NotFound:  # the server has not taken it from the stream yet
        return None
    seen = (status.state, status.reason)
    return seen if seen == ("queued", "no_group_matches") else None


async def _not(awaitable) -> bool:
    return not await awaitable
