"""A Python worker and a Python client against a running cronoq.

Start a local cronoq first (nats-server, a server and two demo workers:
``dev-cpu`` unlabeled, ``dev-gpu`` with gpu=a100)::

    cargo run --release -- dev          # needs nats-server on PATH

then, from another terminal::

    python python/examples/remote.py

This process joins pool ``default`` as a worker with the labels
``lang=python`` (2 slots), submits tasks over NATS and over HTTP, and
prints where each ran: tasks that require ``lang=python`` run only here,
unlabeled tasks go to the least specialized worker (``dev-cpu``). Set
``CRONOQ_NATS`` / ``CRONOQ_HTTP`` if ``cronoq dev`` printed other
addresses.
"""

import asyncio
import os

import cronoq

NATS = os.environ.get("CRONOQ_NATS", "nats://127.0.0.1:4222")
HTTP = os.environ.get("CRONOQ_HTTP", "http://127.0.0.1:7070")


async def main() -> None:
    worker = cronoq.Worker(NATS, pool="default", labels={"lang": "python"}, slots=2, id="py-example")

    @worker.handler
    async def run(ctx: cronoq.TaskContext, payload: bytes) -> str:
        await asyncio.sleep(0.1)
        return f"{payload.decode()} (python, task {ctx.task_id}, attempt {ctx.attempt})"

    running = asyncio.create_task(worker.run())
    nats = cronoq.Client(NATS)
    http = cronoq.Client(HTTP)
    try:
        while not any(w.id == "py-example" for w in (await nats.snapshot()).workers):
            if running.done():
                running.result()  # raises why the worker stopped
            await asyncio.sleep(0.1)

        ids = [
            await nats.submit(b"hello from python", labels={"lang": "python"}),
            await http.submit("over http", labels={"lang": "python"}, priority=5),
            await nats.submit(b"anywhere"),  # unlabeled: the least specialized worker
        ]
        for task_id in ids:
            status = await nats.wait(task_id)
            attempt = status.attempts[-1]
            print(f"task {task_id}: {status.state} on {attempt.worker} -> {(status.output or b'').decode()}")
        print((await http.snapshot()).to_table())
    finally:
        running.cancel()  # drains: running attempts finish, then it deregisters
        try:
            await running
        except asyncio.CancelledError:
            pass


if __name__ == "__main__":
    asyncio.run(main())
