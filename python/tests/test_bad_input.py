"""Bad input raises at the call, with a clear message and a stable code,
and changes nothing."""

from __future__ import annotations

import pytest

import cronoq
from cronoq import _native
from cronoq._errors import CLASSES_BY_CODE


def ran_nothing(sched: cronoq.Scheduler, calls: list) -> None:
    assert calls == []
    pool = sched.snapshot().pool("default")
    assert pool is None or (pool.waiting, pool.busy, pool.scheduled) == (0, 0, 0)


@pytest.fixture
def sched_and_calls():
    sched = cronoq.Scheduler(max_payload_bytes=1024)
    sched.set_capacity("default", 1)
    calls: list = []

    @sched.executor("default")
    async def run(ctx, payload):
        calls.append(payload)
        return payload

    return sched, calls


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(labels={"gpu": 3}), "labels must map str to str, not str to int"),
        (dict(labels={"bad name!": "x"}), "label"),
        (dict(labels={"gpu": ""}), "label"),
        (dict(labels="gpu"), "gpu"),
        (dict(labels=["gpu=a100"]), "labels must be a dict"),
        (dict(pool="no such pool!"), "pool"),
        (dict(priority="high"), "priority must be an int, not str"),
        (dict(priority=2**40), "priority must be a 32-bit signed integer"),
        (dict(max_attempts=-1), "max_attempts must be a positive 32-bit integer"),
        (dict(max_attempts=0), "max_attempts"),
        (dict(deadline="tomorrow"), "deadline must be a datetime.datetime"),
        (dict(start_at=5, tolerance=-1), "tolerance must be a finite, non-negative duration"),
        (dict(tolerance=5), "tolerance is given without start_at"),
        (dict(attempt_timeout=float("nan")), "attempt_timeout must be a finite"),
        (dict(backoff=(2, 1)), "backoff"),
        (dict(backoff=1), "backoff must be a pair"),
        (dict(idempotency_key=7), "idempotency_key must be a str"),
    ],
)
async def test_bad_submit_arguments_raise_invalid_argument_and_change_nothing(
    sched_and_calls, kwargs, message
):
    sched, calls = sched_and_calls
    with pytest.raises(cronoq.InvalidArgument) as raised:
        sched.submit(b"x", **kwargs)  # raises at the call, before any await
    assert message in str(raised.value)
    assert raised.value.code == "INVALID_ARGUMENT"
    assert isinstance(raised.value, (ValueError, TypeError))
    ran_nothing(sched, calls)
    # Nothing changed: the next task is task 1.
    h = await sched.submit(b"ok")
    assert h.id == 1
    assert (await h.wait()).ok


async def test_payloads_of_the_wrong_type_or_over_the_limit(sched_and_calls):
    sched, calls = sched_and_calls
    with pytest.raises(cronoq.InvalidArgument, match="payload must be bytes or str, not int"):
        sched.submit(5)
    with pytest.raises(cronoq.InvalidArgument, match="payload of 1025 bytes is above the limit of 1024"):
        sched.submit(b"x" * 1025)
    ran_nothing(sched, calls)
    out = await (await sched.submit("héllo")).wait()
    assert out.output == "héllo".encode()
    out = await (await sched.submit(bytearray(b"raw"))).wait()
    assert out.output == b"raw"


async def test_unknown_pool_is_refused_and_changes_nothing(sched_and_calls):
    sched, calls = sched_and_calls
    with pytest.raises(cronoq.FailedPrecondition, match="pool gpu has no executor") as raised:
        sched.submit(b"x", pool="gpu")
    assert raised.value.code == "FAILED_PRECONDITION"
    assert sched.snapshot().pool("gpu") is None
    ran_nothing(sched, calls)


def test_bad_capacity_and_pool_settings_change_nothing():
    sched = cronoq.Scheduler()
    sched.set_capacity("default", 2)
    before = sched.snapshot()
    for call, message in [
        (lambda: sched.set_capacity("default", -1), "slots must be a non-negative 32-bit integer"),
        (lambda: sched.set_capacity("default", "2"), "slots must be an int, not str"),
        (lambda: sched.set_capacity("bad pool!", 1), "pool"),
        (lambda: sched.set_group_capacity("default", {"gpu": "a 100"}, 1), "label"),
        (lambda: sched.set_group_capacity("default", {"gpu": 1}, 1), "labels must map str to str"),
        (lambda: sched.configure_pool("default", on_miss="maybe"), 'on_miss must be "skip" or "run"'),
        (lambda: sched.configure_pool("default", urgency_window=-5), "urgency_window"),
    ]:
        try:
            call()
        except cronoq.InvalidArgument as e:
            assert message in str(e)
        else:
            if message:
                pytest.fail(f"no error; expected {message!r}")
    after = sched.snapshot()
    assert after.pools == before.pools


def test_bad_worker_options_raise_at_once():
    url = "nats://127.0.0.1:1"
    for kwargs, message in [
        (dict(labels={"gpu": 1}), "labels must map str to str"),
        (dict(pool="a.b"), "pool"),
        (dict(slots=0), "slots must be at least 1"),
        (dict(slots="2"), "slots must be an int"),
        (dict(nkey_seed="SUnot-a-seed"), "nkey seed is not valid"),
        (dict(token=""), "token is empty"),
        (dict(token="t", nkey_seed="x"), "give token or nkey_seed, not both"),
        (dict(id="has space"), "worker id"),
        (dict(grace="long"), "grace must be a datetime.timedelta or a number of seconds"),
    ]:
        with pytest.raises(cronoq.InvalidArgument) as raised:
            cronoq.Worker(url, **kwargs)
        assert message in str(raised.value), (kwargs, str(raised.value))


async def test_client_refuses_bad_input_before_sending():
    with pytest.raises(cronoq.InvalidArgument, match="url must be"):
        cronoq.Client("localhost:4222")
    # Over HTTP, nothing is sent for a bad task: no server is needed to refuse it.
    client = cronoq.Client("http://127.0.0.1:1")
    with pytest.raises(cronoq.InvalidArgument, match="labels must map str to str"):
        await client.submit(b"x", labels={"gpu": 1})
    with pytest.raises(cronoq.Unavailable):
        await client.submit(b"x")


def test_every_code_has_its_class():
    # The codes come from the crate's one list (`ErrorCode::ALL`), so a code
    # added there fails here until `cronoq._errors` has a class for it.
    codes = _native.error_codes()
    assert codes and len(set(codes)) == len(codes), codes
    assert {cls.code for cls in cronoq.Error.__subclasses__()} == set(codes)
    assert set(CLASSES_BY_CODE) == set(codes)
    e = cronoq.NotFound("task 9 not found")
    assert e.code == "NOT_FOUND" and str(e) == "task 9 not found [NOT_FOUND]"
