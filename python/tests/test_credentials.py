"""Client credentials (issue 9) without a cronoq server: bad options raise
:class:`cronoq.InvalidArgument` in the constructor, before anything
connects; a token travels over HTTP as ``Authorization: Bearer`` and the
server's refusal comes back as the mapped exception. (The leader's rules
are tested against a real server in the Rust suite, tests/auth_clients.rs.)
"""

from __future__ import annotations

import asyncio
import json
from typing import List

import pytest

import cronoq

# A throwaway nkey pair from `cronoq keygen`, for tests only.
SEED = "SUAJ345TEL7NR3M3D2KAMPIHPNAPT7LUZ4MCFWEWMJL6RHCWZ6W4AZEMMY"
TOKEN = "submitter-token-0123456789"


def test_credential_options_are_accepted(monkeypatch):
    monkeypatch.setenv("CRONOQ_TEST_TOKEN", TOKEN)
    for url in ["nats://127.0.0.1:1", "http://127.0.0.1:1"]:
        cronoq.Client(url, token=TOKEN)
        cronoq.Client(url, token_env="CRONOQ_TEST_TOKEN")
        cronoq.Client(url, nats_token="nats-connection-token")
    cronoq.Client("nats://127.0.0.1:1", nkey_seed=SEED)
    cronoq.Client("nats://127.0.0.1:1", nkey_seed=SEED + "\n")


def test_bad_credentials_raise_at_once(monkeypatch):
    monkeypatch.delenv("CRONOQ_TEST_UNSET_TOKEN", raising=False)
    monkeypatch.setenv("CRONOQ_TEST_EMPTY_TOKEN", "")
    nats = "nats://127.0.0.1:1"
    for url, kwargs, message in [
        (nats, dict(nkey_seed="SUnot-a-seed"), "nkey seed is not valid"),
        (nats, dict(token=""), "token is empty"),
        (nats, dict(token="t", nkey_seed=SEED), "give token or nkey_seed, not both"),
        (nats, dict(token_env="CRONOQ_TEST_UNSET_TOKEN"), "CRONOQ_TEST_UNSET_TOKEN, which is not set"),
        (nats, dict(token_env="CRONOQ_TEST_EMPTY_TOKEN"), "which is not set"),
        (nats, dict(token_env="X", token="t"), "not more than one"),
        ("http://127.0.0.1:1", dict(nkey_seed=SEED), "nkey_seed cannot be used over HTTP"),
    ]:
        with pytest.raises(cronoq.InvalidArgument) as raised:
            cronoq.Client(url, **kwargs)
        assert message in str(raised.value), (kwargs, str(raised.value))
        assert SEED not in str(raised.value)


class Recorder:
    """A one-route HTTP server that answers every request 401
    ``UNAUTHENTICATED`` and records the ``Authorization`` it got."""

    def __init__(self) -> None:
        self.authorization: List[str] = []
        self.server: asyncio.AbstractServer | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        auth = ""
        length = 0
        for line in head.decode().split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "authorization":
                auth = value.strip()
            if name.lower() == "content-length":
                length = int(value.strip())
        if length:
            await reader.readexactly(length)
        self.authorization.append(auth)
        body = json.dumps({"code": "UNAUTHENTICATED", "message": "unknown credential"}).encode()
        writer.write(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


async def test_a_token_is_sent_as_bearer_and_the_refusal_is_mapped():
    recorder = Recorder()
    url = await recorder.start()
    try:
        client = cronoq.Client(url, token=TOKEN)
        with pytest.raises(cronoq.Unauthenticated) as raised:
            await client.snapshot()
        assert raised.value.code == "UNAUTHENTICATED"
        with pytest.raises(cronoq.Unauthenticated):
            await client.submit(b"x")
        anonymous = cronoq.Client(url)
        with pytest.raises(cronoq.Unauthenticated):
            await anonymous.get(1)
        assert recorder.authorization == [f"Bearer {TOKEN}", f"Bearer {TOKEN}", ""]
    finally:
        assert recorder.server is not None
        recorder.server.close()
