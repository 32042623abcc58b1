"""OpenTelemetry export from the Python package: off unless asked, and
then as the ``OTEL_*`` env vars say. The exporter is one per process, so
each case runs a fresh interpreter (with the installed package) against a
collector in this test that takes OTLP/HTTP posts to ``/v1/traces``."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
from typing import List, Tuple

SCRIPT = textwrap.dedent(
    """
    import asyncio, cronoq

    async def main():
        on = cronoq.enable_telemetry()
        sched = cronoq.Scheduler(telemetry=True)
        sched.set_capacity("default", 1)
        seen = []

        @sched.executor("default")
        async def run(ctx, payload):
            seen.append(ctx.traceparent)
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
            return b"ok"

        sched.configure_pool("default", max_attempts=3, backoff=(0.01, 0.01))
        handle = await sched.submit(b"x")
        outcome = await handle.wait()
        print(on, outcome.ok, " ".join(str(tp) for tp in seen))

    asyncio.run(main())
    """
)


class Collector(http.server.BaseHTTPRequestHandler):
    posts: List[Tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Collector.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def run(env: dict) -> List[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    clean.update(env)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=clean, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_without_otel_env_nothing_is_exported_and_contexts_are_the_submitters():
    on, ok, *seen = run({})
    assert (on, ok) == ("False", "True")
    assert seen == ["None", "None"], "no trace context was invented"


def test_with_an_endpoint_the_tasks_spans_are_posted_and_executors_see_their_attempt_span():
    Collector.posts = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        on, ok, *seen = run(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "py-test"}
        )
    finally:
        server.shutdown()
    assert (on, ok) == ("True", "True")
    assert len(seen) == 2
    versions, traces, spans, flags = zip(*(tp.split("-") for tp in seen))
    assert len(set(traces)) == 1, "both attempts in the task's trace"
    assert len(set(spans)) == 2, "a span per attempt"
    # Exported at exit (atexit), as protobuf, to <endpoint>/v1/traces.
    assert Collector.posts, "spans were posted"
    body = b"".join(post[2] for post in Collector.posts)
    assert {post[0] for post in Collector.posts} == {"/v1/traces"}
    assert {post[1] for post in Collector.posts} == {"application/x-protobuf"}
    assert bytes.fromhex(traces[0]) in body
    for span in spans:
        assert bytes.fromhex(span) in body, "the attempt span the executor saw"
    for name in (b"cronoq.task", b"cronoq.queued", b"cronoq.attempt", b"py-test"):
        assert name in body
