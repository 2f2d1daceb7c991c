"""A tiny OpenAI-style chat server process for the judge tests: ``python judge_stub.py PORT``.

``/slow/v1/chat/completions`` sleeps 30 s before answering (a judge that times out);
``/flaky/v1/chat/completions`` answers 503 to every other request and ``Score: 9`` otherwise (a
judge worth retrying); ``/fast/v1/chat/completions`` answers ``Score: 9`` at once; ``/health``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_lock = threading.Lock()
_flaky_calls = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/health" else 404, {"ok": True})

    def do_POST(self) -> None:
        global _flaky_calls
        length = int(self.headers.get("content-length", 0))
        request = json.loads(self.rfile.read(length))
        assert request["messages"][-1]["role"] == "user"
        answer = {"choices": [{"message": {"role": "assistant", "content": "Score: 9"}}]}
        if self.path.startswith("/slow/"):
            time.sleep(30)
        elif self.path.startswith("/flaky/"):
            with _lock:
                _flaky_calls += 1
                fail = _flaky_calls % 2 == 1
            if fail:
                self._send(503, {"error": "overloaded"})
                return
        elif not self.path.startswith("/fast/"):
            self._send(404, {"error": self.path})
            return
        self._send(200, answer)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
