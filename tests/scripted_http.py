"""A real HTTP server that answers ``POST`` as a scripted peer: each request gets the next
``(status, headers)`` of ``Script.answers`` (the last one repeats), a 200 with a ``/v1/verify``
reply for the request's items; ``Script.times`` records when each request arrived. The tests of the
reward client and of the client base drive their retries against it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Script:
    """Answers to give, in order; the last one repeats."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.times: list[float] = []


@contextmanager
def scripted_server() -> Iterator[tuple[str, Script]]:
    """The server's base URL and its script, for the duration of the block."""
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            script.times.append(time.monotonic())
            status, headers = script.answers[min(len(script.times), len(script.answers)) - 1]
            payload = b""
            if status == 200:
                results = [
                    {
                        "id": it["id"],
                        "score": 1.0,
                        "correct": True,
                        "format_ok": True,
                        "reason": "ok",
                    }
                    for it in body["items"]
                ]
                payload = json.dumps({"results": results}).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
