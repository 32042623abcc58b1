"""A first look at cronoq embedded, from Python: one pool with an unlabeled
group (2 slots) and a ``gpu=a100`` group (1 slot); a mix of labeled,
unlabeled, deadline, fixed-start and flaky tasks; where each ran; the
final snapshot.

Run: ``python python/examples/embedded.py`` (after ``pip install ./python``).
"""

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Tuple

import cronoq


async def main() -> None:
    sched = cronoq.Scheduler()
    sched.set_capacity("inference", 2)  # the unlabeled group
    sched.set_group_capacity("inference", {"gpu": "a100"}, 1)

    @sched.executor("inference")
    async def run(ctx: cronoq.TaskContext, payload: bytes) -> bytes:
        text = payload.decode()
        if text.startswith("flaky") and ctx.attempt == 1:
            raise RuntimeError("first attempt always fails")  # retried with backoff
        await asyncio.sleep(0.15)
        return f"{text} done".encode()

    now = datetime.now(timezone.utc)
    gpu = {"gpu": "a100"}
    tasks: List[Tuple[str, str, Dict[str, Any]]] = [
        ("labeled", "train-1", dict(labels=gpu)),
        ("unlabeled", "resize-1", {}),
        ("unlabeled", "resize-2", {}),
        ("labeled", "train-2", dict(labels=gpu)),
        ("unlabeled", "resize-3", {}),
        ("deadline", "report", dict(deadline=timedelta(milliseconds=200))),
        ("fixed-start", "nightly", dict(start_at=now + timedelta(milliseconds=500), tolerance=2)),
        ("retried", "flaky-1", dict(backoff=(0.05, 1))),
        ("unlabeled", "resize-4", {}),
    ]
    handles = []
    for kind, payload, options in tasks:
        handle = await sched.submit(payload, pool="inference", **options)
        handles.append((kind, options.get("labels"), handle))
    print("while running:")
    print(sched.snapshot().to_table())

    print(f"{'TASK':<5} {'KIND':<12} {'REQUIRES':<10} {'STATE':<10} {'RAN IN':<12} {'ATTEMPTS':>8}  OUTPUT")
    for kind, labels, handle in handles:
        outcome = await handle.wait()
        group = outcome.group
        ran_in = "-" if group is None else ",".join(f"{k}={v}" for k, v in group.items()) or "(unlabeled)"
        requires = ",".join(f"{k}={v}" for k, v in (labels or {}).items()) or "-"
        output = (outcome.output or b"").decode()
        print(f"{handle.id:<5} {kind:<12} {requires:<10} {outcome.state:<10} {ran_in:<12} {len(outcome.attempts):>8}  {output}")
    print("\nfinal snapshot:")
    print(sched.snapshot().to_table())


if __name__ == "__main__":
    asyncio.run(main())
