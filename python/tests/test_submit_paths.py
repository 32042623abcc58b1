"""One way in for submissions (issue 21 item 3): every row of the table in
``tests/data/submit_refusals.json`` that Python can say is refused by
``submit(...)`` with the same code and message as over HTTP, a NATS plain
publish and the CLI (``tests/submit_paths.rs`` sends the same rows there),
and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cronoq

TABLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "submit_refusals.json"
ROWS = json.loads(TABLE.read_text())["rows"]


def test_the_table_is_read_and_python_says_most_of_it():
    said = [row for row in ROWS if row["python"] is not None]
    assert len(said) >= 7, [row["name"] for row in ROWS]
    # A row Python cannot say tells why.
    assert all(row.get("why") for row in ROWS if row["python"] is None)


@pytest.mark.parametrize(
    "row", [row for row in ROWS if row["python"] is not None], ids=lambda row: row["name"]
)
async def test_the_same_bad_submission_is_refused_alike_in_python(row):
    sched = cronoq.Scheduler()
    sched.set_capacity("default", 1)

    @sched.executor("default")
    async def run(ctx, payload):
        return payload

    kwargs = dict(row["python"])
    if isinstance(kwargs.get("backoff"), list):
        kwargs["backoff"] = tuple(kwargs["backoff"])
    with pytest.raises(cronoq.Error) as raised:
        sched.submit(b"x", **kwargs)  # raises at the call, before any await
    assert raised.value.code == row["code"]
    assert raised.value.message == row["message"]
    # As the CLI prints it: `MESSAGE [CODE]`.
    assert str(raised.value) == f"{row['message']} [{row['code']}]"
    # Nothing changed: the next task is task 1.
    h = await sched.submit(b"ok")
    assert h.id == 1
    assert (await h.wait()).ok
