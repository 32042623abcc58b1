"""Throughput of the embedded Python scheduler beside plain asyncio.

100,000 no-op tasks through ``cronoq.Scheduler`` (one pool, 64 slots, an
``async def`` executor), submitted and then awaited, beside 100,000 no-op
coroutines gated by ``asyncio.Semaphore(64)`` and gathered, in the same
process and run. Prints tasks/s per round, the medians, their ratio and
PASS/FAIL against the target (ratio >= 0.5). Never fails.

Run: ``python python/bench/bench_embedded.py`` with a release build of the
package installed (``pip install ./python`` builds one).
``CRONOQ_BENCH_TASKS`` and ``CRONOQ_BENCH_ROUNDS`` change the size (default
100,000 tasks, 5 rounds).
"""

import asyncio
import gc
import os
import statistics
import time
from typing import List, Optional

import cronoq

TASKS = int(os.environ.get("CRONOQ_BENCH_TASKS", "100000"))
ROUNDS = int(os.environ.get("CRONOQ_BENCH_ROUNDS", "5"))
SLOTS = 64
TARGET = 0.5


async def noop(ctx: Optional[cronoq.TaskContext], payload: bytes) -> None:
    return None


async def through_cronoq(n: int) -> float:
    sched = cronoq.Scheduler()
    sched.set_capacity("bench", SLOTS)
    sched.executor("bench")(noop)
    start = time.perf_counter()
    handles = [await sched.submit(b"", pool="bench") for _ in range(n)]
    outcomes = await asyncio.gather(*[h.wait() for h in handles])
    elapsed = time.perf_counter() - start
    assert len(outcomes) == n and all(o.ok for o in outcomes), "a task did not succeed"
    sched.close()
    return n / elapsed


async def through_semaphore(n: int) -> float:
    sem = asyncio.Semaphore(SLOTS)

    async def one() -> None:
        async with sem:
            return await noop(None, b"")

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - start
    return n / elapsed


async def main() -> None:
    cronoq_rates: List[float] = []
    baseline_rates: List[float] = []
    for round in range(ROUNDS):
        # Alternate which goes first, so neither always runs on a warmer heap.
        order = [(through_cronoq, cronoq_rates), (through_semaphore, baseline_rates)]
        if round % 2:
            order.reverse()
        for run, rates in order:
            gc.collect()
            rates.append(await run(TASKS))
        print(
            f"round {round + 1}: cronoq {cronoq_rates[-1]:,.0f} tasks/s, "
            f"asyncio.Semaphore({SLOTS}) {baseline_rates[-1]:,.0f} tasks/s",
            flush=True,
        )
    c, b = statistics.median(cronoq_rates), statistics.median(baseline_rates)
    ratio = c / b
    print(f"{TASKS:,} no-op tasks, {ROUNDS} rounds, medians:")
    print(f"  cronoq embedded (async executor, {SLOTS} slots): {c:,.0f} tasks/s")
    print(f"  asyncio.Semaphore({SLOTS}) + gather:            {b:,.0f} tasks/s")
    print(f"  ratio {ratio:.3f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}")


if __name__ == "__main__":
    asyncio.run(main())
