"""The dashboard's HTTP server: two pages, one script, and three JSON routes.

Routes (all GET): ``/`` charts page, ``/samples`` samples page, ``/static/dashboard.js``,
``/api/charts`` (every chart with its lines, the held-out evaluations, the services' warnings,
the run's state and that of each data source; query ``prompt``: the prompt of the DynaMO per-prompt views), ``/api/samples``
(filtered rows; query ``source``, ``min_reward``, ``max_reward``, ``correct``, ``reason``, ``q``,
``limit``), ``/healthz``. The standard library's threading server is enough: a handful of people
poll it every few seconds, and it keeps the shared package free of another web framework.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dashboard.charts import CHARTS, Chart
from dashboard.sources import (
    JsonlLog,
    RunFolder,
    SampleFilter,
    SampleReader,
    Scraper,
    chart_data,
)

__all__ = ["Dashboard", "make_server"]

log = logging.getLogger("dashboard")

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/samples": ("samples.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


@dataclass
class Dashboard:
    """The run being watched: its metrics log, its run folder (the services' metric histories,
    the sample log, the evaluations), the scraped endpoints and the trajectory stream.

    The run folder's histories, when there are any, feed the Prometheus charts (they hold the
    whole run, live and after it); the scrape is used only without them (services whose run
    folder is elsewhere, as under compose or Kubernetes). Redis is read while the run goes on;
    once ``up`` has written ``summary.json`` the run reads as finished and Redis is not asked
    (it went with the run): the stream charts and samples come from the sample log, as they do
    whenever Redis is unreachable.
    """

    log: JsonlLog
    scraper: Scraper
    samples: SampleReader | None
    run_name: str
    charts: tuple[Chart, ...] = CHARTS
    run: RunFolder = field(default_factory=lambda: RunFolder(None))

    def charts_payload(self, prompt: str | None = None) -> dict[str, Any]:
        self.log.refresh()
        self.run.refresh()
        from_folder = self.run.has_history()
        metrics: Any = self.run if from_folder else self.scraper
        charts = [chart_data(c, self.log, metrics) for c in self.charts]
        finished = self.run.finished()
        redis_status: dict[str, Any] = {"configured": self.samples is not None}
        stream: list[dict[str, Any]] | None = None
        if self.samples is not None and not finished:
            try:
                stream = self.samples.stream_charts()
                redis_status["ok"] = True
            except Exception as e:  # Redis down: the other charts still render
                redis_status.update(ok=False, error=f"{type(e).__name__}: {e}")
        elif finished:
            redis_status["skipped"] = "run finished"
        if stream is None and self.run.has_samples():
            stream = self.run.stream_charts()
        if stream is not None:
            # After the allocator's own charts, before throughput.
            at = next((i for i, c in enumerate(charts) if c["group"] == "throughput"), len(charts))
            charts[at:at] = stream
        chosen, dynamo = self.run.dynamo_charts(prompt)
        at = next((i for i, c in enumerate(charts) if c["group"] == "throughput"), len(charts))
        charts[at:at] = dynamo
        return {
            "run": self.run_name,
            "now": time.time(),
            "state": "finished" if finished else "running",
            "charts": charts,
            "evaluations": self.run.evaluations(),
            "warnings": self.run.warnings(),
            "prompts": self.run.prompts(),
            "prompt": chosen,
            "sources": {
                "metrics_log": self.log.status(),
                "run_folder": self.run.status(),
                "metrics": "run folder" if from_folder else "scrape",
                "scrape": [] if from_folder else self.scraper.status(),
                "redis": redis_status,
            },
        }

    def samples_payload(self, flt: SampleFilter) -> dict[str, Any]:
        if self.samples is not None and not self.run.finished():
            try:
                return {**self.samples.read(flt), "origin": "redis", "run": self.run_name}
            except Exception:
                if not self.run.has_samples():
                    raise
        if self.samples is None and not self.run.has_samples():
            return {"rows": [], "sources": [], "reasons": [], "error": "no Redis configured"}
        return {**self.run.read(flt), "run": self.run_name}


def _static(name: str) -> bytes:
    return resources.files("dashboard").joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard
    server_version = "dynamo-rl-dashboard"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per poll is noise
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # The pages load only their own script; nothing from anywhere else.
        self.send_header(
            "Content-Security-Policy",
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path in STATIC:
            name, ctype = STATIC[path]
            self._send(HTTPStatus.OK, _static(name), ctype)
        elif path == "/healthz":
            self._json(HTTPStatus.OK, {"ok": True})
        elif path == "/api/charts":
            prompt = parse_qs(url.query).get("prompt", [None])[0] or None
            self._json(HTTPStatus.OK, self.dashboard.charts_payload(prompt))
        elif path == "/api/samples":
            try:
                flt = SampleFilter.from_query(parse_qs(url.query))
            except ValueError as e:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
                return
            try:
                self._json(HTTPStatus.OK, self.dashboard.samples_payload(flt))
            except Exception as e:  # Redis unreachable: say so instead of a bare 500
                self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"{type(e).__name__}: {e}"})
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {path}"})


def make_server(dashboard: Dashboard, host: str, port: int) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0: a free one); call ``serve_forever`` on it."""
    handler = type("Handler", (_Handler,), {"dashboard": dashboard})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    return thread
