"""Credentials against a real ``cronoq server`` with ``[auth] required =
true`` (issue 9), from Python, over NATS and over HTTP: a submitter's
token submits, reads and cancels its own tasks; no token is
:class:`cronoq.Unauthenticated`; a reader cannot submit or cancel and
another submitter cannot cancel (:class:`cronoq.PermissionDenied`).
"""

from __future__ import annotations

import cronoq
from conftest import TOKENS, eventually

# Nobody has this label: tasks wait, so they can be cancelled.
NOBODY = {"gpu": "nobody"}


async def test_tokens_decide_who_may_submit_read_and_cancel(auth_cluster):
    for url in [auth_cluster.nats_url, auth_cluster.http_url]:
        a = cronoq.Client(url, token=TOKENS["CRONOQ_PY_SUBMITTER_A"])
        b = cronoq.Client(url, token=TOKENS["CRONOQ_PY_SUBMITTER_B"])
        reader = cronoq.Client(url, token=TOKENS["CRONOQ_PY_READER"])
        anonymous = cronoq.Client(url)

        task_id = await a.submit(b"waits", labels=NOBODY)
        status = await eventually("the task to be known", lambda: a.get(task_id))
        assert status.state == "queued", (url, status)
        assert (await reader.get(task_id)).state == "queued"

        try:
            await anonymous.get(task_id)
            raise AssertionError(f"{url}: an anonymous read was answered")
        except cronoq.Unauthenticated:
            pass
        for who, call in [
            ("reader submit", lambda: reader.submit(b"no", labels=NOBODY)),
            ("reader cancel", lambda: reader.cancel(task_id)),
            ("other submitter cancel", lambda: b.cancel(task_id)),
        ]:
            try:
                await call()
                raise AssertionError(f"{url}: {who} was allowed")
            except cronoq.PermissionDenied:
                pass
        assert (await a.get(task_id)).state == "queued"

        await a.cancel(task_id)
        status = await eventually(
            "the cancel", lambda: _state_is(a, task_id, "cancelled")
        )
        assert status.state == "cancelled"


async def _state_is(client: cronoq.Client, task_id: int, state: str):
    status = await client.get(task_id)
    return status if status.state == state else None
