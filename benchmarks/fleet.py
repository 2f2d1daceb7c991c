"""Fleet simulator: what saturates first when the engine fleet grows.

Real processes on free ports, started through the service table (:mod:`dynamo_rl.service_table`):
Redis, ``dynamo-rl allocator``, ``dynamo-rl reward`` and 1-16 ``dynamo-rl rollout`` workers; a
learner-side **stream reader** (:class:`dynamo_rl.contracts.stream.TrajectoryReader`, reading and
acknowledging as the learner does, without training); and **simulated engines**: one asyncio
process serving SGLang's ``/generate``, ``/get_weight_version`` and ``/health`` on ``E`` ports
(requests parsed with the engine's own ``GenerateRequest``). Each simulated engine answers with
canned token ids (text ending in ``\\boxed{d}``, a random digit, or for a ``--symbolic`` fraction
of responses ``\\boxed{\\frac{2dk}{2k}}``, which needs math-verify) after a delay that gives it an
aggregate decode rate of ``--engine-tokens-per-s``: requests are served first come first served,
each taking ``n x max_new_tokens / rate`` seconds times a log-normal jitter (sigma 0.2). Its
generation capacity is therefore ``E x rate / max_tokens`` responses/s.

Per fleet (``ExW``: E engines, W workers) it measures, over ``--duration`` seconds after a warm-up:

- responses/s that reached the reader (end to end), and the ratio to the engines' capacity;
- where a batch's time goes, from the workers' ``dynamo_rollout_batch_seconds{phase}``; the
  allocator's ``Allocate``/``ReportOutcomes`` latency (``dynamo_allocator_request_latency_seconds``),
  the reward service's ``/v1/verify`` latency (``dynamo_reward_request_duration_seconds``) and the
  reader's time per read + acknowledge;
- each process tree's CPU (``/proc/<pid>/stat``, children included) in cores;
- queue depths, sampled every 0.5 s: the reward service's ``dynamo_reward_queue_depth``, the
  stream's lag (entries the reader has not read) and requests in flight at the engines.

A service **saturates** at the first fleet where its CPU reaches ``SATURATED_CORES`` of a core per
process, its queue keeps growing, or its latency reaches ``LATENCY_GROWTH`` x the smallest fleet's;
the whole path when its share of the engines' capacity drops below 80 % of the best smaller
fleet's (:func:`saturation`). Everything shares this machine's cores (2, loaded by other work), so
the saturation points are for this machine; the projection uses CPU-seconds per unit of work, i.e.
it is per core.

Projection: ``--gpu-tokens-per-s`` and ``--gpu-response-tokens`` give a GPU's responses/s; the
measured core-seconds per response (reward) and per prompt (allocator) give how many replicas of
each a cluster of N GPUs needs (:func:`replicas_for`), at ``TARGET_UTILISATION`` of each replica's
CPU limit in ``deploy/k8s``; the rollout workers' and the stream reader's cores follow from their
core-seconds per token. The table goes to the results JSON and ``docs/deploy.md``
(:func:`sizing_markdown`).

    python benchmarks/fleet.py                  # 8x1, 32x4, 128x16
    python benchmarks/fleet.py --quick          # one tiny fleet (the smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _machine import write_result  # noqa: E402 - the result file, with its machine

SATURATED_CORES = 0.8
TARGET_UTILISATION = 0.5
"""Replicas are sized to run at half of their CPU limit (room for bursts: a step's responses
arrive together, not evenly)."""
REPLICA_CORES = {"reward": 8.0, "allocator": 2.0}
"""CPU limit of one replica in deploy/k8s/base (reward.yaml, allocator.yaml)."""
RESPONSES_PER_STEP = 8192
PROMPTS_PER_STEP = 512
CLUSTER_GPUS = (8, 16, 64, 256, 1024, 4096)
ANSWERS = 10  # ground truths and canned answers are the digits 0..9


# -- simulated engines ----------------------------------------------------------------------------


class _Engines:
    """ASGI app behind every simulated engine's socket; the port tells which engine is asked."""

    def __init__(self, rate: float, seed: int, symbolic: float = 0.0) -> None:
        self.rate = rate
        self.symbolic = symbolic
        self.rng = random.Random(seed)
        self.free_at: dict[int, float] = {}
        self.in_flight: dict[int, int] = {}
        self.requests = 0
        self.samples = 0
        self._canned: dict[int, list[str]] = {}

    def canned(self, tokens: int) -> list[str]:
        """One JSON sample per answer digit with ``tokens`` token ids (cached per length), and
        last a template whose answer is filled in per response (:meth:`pick`)."""
        if tokens not in self._canned:
            out = []
            for answer in [*map(str, range(ANSWERS)), "@ANSWER@"]:
                ids = [3 + (i * 7) % 250 for i in range(tokens)]
                triples = [[-0.5, t, None] for t in ids]
                out.append(
                    json.dumps(
                        {
                            "text": f"so the answer is \\boxed{{{answer}}}",
                            "output_ids": ids,
                            "meta_info": {
                                "output_token_logprobs": triples,
                                "finish_reason": {"type": "length"},
                                "weight_version": 0,
                            },
                        }
                    )
                )
            self._canned[tokens] = out
        return self._canned[tokens]

    def pick(self, canned: list[str]) -> str:
        """A random digit as a plain integer (the reward service's fast path) or, with
        probability ``symbolic``, as a fraction equal to it, ``\\frac{2dk}{2k}`` with a random
        ``k`` (math-verify's symbolic path; distinct, so no de-duplication saves the work)."""
        d = self.rng.randrange(ANSWERS)
        if self.rng.random() >= self.symbolic:
            return canned[d]
        k = self.rng.randrange(1, 10_000)
        return canned[ANSWERS].replace("@ANSWER@", f"\\\\frac{{{2 * d * k}}}{{{2 * k}}}")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                if kind == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif kind == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        port = scope["server"][1]
        if path == "/generate" and scope["method"] == "POST":
            body = b""
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if not msg.get("more_body"):
                    break
            await self.generate(port, body, send)
        elif path == "/health":
            await _reply(send, 200, b"{}")
        elif path == "/get_weight_version":
            await _reply(send, 200, b'{"weight_version": 0}')
        elif path == "/stats":
            stats = {
                "requests": self.requests,
                "samples": self.samples,
                "in_flight": sum(self.in_flight.values()),
            }
            await _reply(send, 200, json.dumps(stats).encode())
        else:
            await _reply(send, 404, b'{"detail": "not found"}')

    async def generate(self, port: int, body: bytes, send: Any) -> None:
        from pydantic import ValidationError

        from dynamo_rl.contracts.engine import GenerateRequest

        try:
            req = GenerateRequest.model_validate_json(body)
        except ValidationError as e:
            await _reply(send, 422, json.dumps({"detail": e.errors()}, default=str).encode())
            return
        n = req.sampling_params.n
        tokens = req.sampling_params.max_new_tokens or 16
        now = time.monotonic()
        service = n * tokens / self.rate * math.exp(self.rng.gauss(0.0, 0.2))
        finish = max(now, self.free_at.get(port, 0.0)) + service
        self.free_at[port] = finish
        self.in_flight[port] = self.in_flight.get(port, 0) + 1
        try:
            await asyncio.sleep(finish - now)
        finally:
            self.in_flight[port] -= 1
        canned = self.canned(tokens)
        out = "[" + ",".join(self.pick(canned) for _ in range(n)) + "]"
        self.requests += 1
        self.samples += n
        await _reply(send, 200, out.encode())


async def _reply(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_engines(args: argparse.Namespace) -> int:
    """``fleet.py engines``: serve ``--count`` simulated engines; their ports go to ``--ports``."""
    import socket

    import uvicorn

    socks = []
    for _ in range(args.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1024)
        socks.append(s)
    app = _Engines(args.tokens_per_s, args.seed, args.symbolic)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", backlog=1024, http="h11"
    )
    server = uvicorn.Server(config)
    ports = [s.getsockname()[1] for s in socks]
    tmp = Path(args.ports).with_suffix(".tmp")
    tmp.write_text(json.dumps(ports))
    tmp.replace(args.ports)
    server.run(sockets=socks)
    return 0


# -- the learner's stream reader -------------------------------------------------------------------


def run_reader(args: argparse.Namespace) -> int:
    """``fleet.py reader``: read and acknowledge the stream as the learner does; write running
    totals to ``--stats`` every 0.5 s."""
    import signal

    from dynamo_rl.contracts.stream import TrajectoryReader
    from dynamo_rl.redis_client import sync_client

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = sync_client(args.redis_url, timeout_s=30.0)
    reader = TrajectoryReader(client, args.namespace, vocab_size=args.vocab)
    reader.setup()
    totals = {
        "entries": 0, "responses": 0, "busy_s": 0.0, "cpu_s": 0.0, "reads": 0, "lag_s_sum": 0.0,
    }  # fmt: skip
    lags: list[float] = []
    last = 0.0
    newest = "0-0"
    while not stop.is_set():
        # Wait (outside the timed part) until the stream holds an entry newer than the last one
        # read, then read without blocking: the timed part is the read, decode and acknowledge.
        client.xread({reader.stream: newest}, count=1, block=200)
        t0, c0 = time.perf_counter(), time.process_time()
        entries = reader.read(256, block_ms=None)
        if entries:
            reader.ack(e.entry_id for e in entries)
            totals["busy_s"] += time.perf_counter() - t0
            totals["cpu_s"] += time.process_time() - c0
            now = time.time()
            newest = entries[-1].entry_id
            totals["reads"] += 1
            totals["entries"] += len(entries)
            totals["responses"] += sum(len(e.group.responses) for e in entries)
            for e in entries:
                lag = now - e.group.timing.created_unix
                totals["lag_s_sum"] += lag
                lags.append(lag)
        if time.monotonic() - last > 0.5:
            last = time.monotonic()
            _write_json(Path(args.stats), {**totals, "lags_tail": lags[-2000:]})
    _write_json(Path(args.stats), {**totals, "lags_tail": lags[-2000:]})
    return 0


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


# -- measuring -------------------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live descendants."""
    from _load import _descendants

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _descendants(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a ``/metrics`` page."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10.0).text
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _hist_quantile(before: dict, after: dict, name: str, q: float, **labels: str) -> float:
    """Quantile ``q`` (upper bucket bound) of a histogram's observations between two scrapes."""
    bounds = []
    for (n, lab), v in after.items():
        d = dict(lab)
        if n != f"{name}_bucket" or any(d.get(k) != w for k, w in labels.items()):
            continue
        le = float(d["le"])
        bounds.append((le, v - before.get((n, lab), 0.0)))
    bounds.sort()
    if not bounds or bounds[-1][1] <= 0:
        return float("nan")
    total = bounds[-1][1]
    for le, cum in bounds:
        if cum >= q * total:
            return le
    return float("inf")


@dataclass
class Fleet:
    engines: int
    workers: int

    @property
    def label(self) -> str:
        return f"{self.engines}x{self.workers}"


def parse_fleets(text: str) -> list[Fleet]:
    """``8x1,32x4`` -> fleets (engines x workers); a ValueError naming the bad item otherwise."""
    out = []
    for item in text.split(","):
        try:
            e, w = (int(x) for x in item.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"--fleets: {item!r} is not ENGINESxWORKERS (e.g. 32x4)") from None
        if e < 1 or not 1 <= w <= 64:
            raise ValueError(f"--fleets: {item!r}: engines >= 1 and 1 <= workers <= 64")
        out.append(Fleet(e, w))
    return out


def run_fleet(fleet: Fleet, args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    """Start one fleet, measure it for ``args.duration`` s, stop it; its figures."""
    import httpx

    from dynamo_rl.procs import ServiceProcess, free_port, http_ok, start_redis
    from dynamo_rl.redis_client import sync_client
    from dynamo_rl.service_table import SERVICES

    tmp = Path(tempfile.mkdtemp(prefix=f"fleet-{fleet.label}-"))
    procs: dict[str, ServiceProcess] = {}
    namespace = "fleet"
    try:
        redis_proc, redis_url = start_redis(tmp / "redis")
        procs["redis"] = redis_proc
        alloc_metrics = free_port()
        procs["allocator"], alloc = SERVICES["allocator"].start(
            tmp / "allocator.log", "--redis-url", redis_url,
            "--metrics-port", str(alloc_metrics), cwd=ROOT, timeout=180,
        )  # fmt: skip
        procs["reward"], reward = SERVICES["reward"].start(
            tmp / "reward.log", "reward.code.enabled=false", cwd=ROOT, timeout=180
        )
        ports_file = tmp / "ports.json"
        me = [sys.executable, str(Path(__file__).resolve())]
        engines = ServiceProcess(
            "engines",
            [*me, "engines", "--count", str(fleet.engines), "--ports", str(ports_file),
             "--tokens-per-s", str(args.engine_tokens_per_s), "--seed", str(args.seed),
             "--symbolic", str(args.symbolic)],
            tmp / "engines.log", cwd=ROOT,
        ).start()  # fmt: skip
        procs["engines"] = engines
        engines.wait_ready(lambda: ports_file.exists(), timeout=120)
        ports = json.loads(ports_file.read_text())
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        engines.wait_ready(http_ok(urls[0] + "/health"), timeout=60)
        reader_stats = tmp / "reader.json"
        procs["reader"] = ServiceProcess(
            "reader",
            [*me, "reader", "--redis-url", redis_url, "--namespace", namespace,
             "--stats", str(reader_stats), "--vocab", "259"],
            tmp / "reader.log", cwd=ROOT,
        ).start()  # fmt: skip
        worker_metrics = []
        for i in range(fleet.workers):
            port = free_port()
            worker_metrics.append(f"http://127.0.0.1:{port}/metrics")
            procs[f"worker{i}"], _ = SERVICES["rollout"].start(
                tmp / f"worker{i}.log", "--metrics-port", str(port),
                f"run.name={namespace}", f"endpoints.redis_url={redis_url}",
                f"endpoints.engine_urls=[{','.join(urls)}]", f"endpoints.reward_url={reward}",
                f"endpoints.allocator_addr={alloc}", f"rollout.dataset={data}",
                f"rollout.tokenizer={model}", "rollout.engine_api=sglang",
                f"rollout.batch_size={args.batch_size}", f"rollout.n={args.n}",
                f"rollout.n_min={max(1, args.n // 4)}", f"rollout.n_max={args.n * 2}",
                f"rollout.sampling.max_tokens={args.max_tokens}",
                f"rollout.num_workers={fleet.workers}", f"rollout.worker_index={i}",
                f"rollout.worker_id=w{i}", "rollout.max_pending_groups=0", "run.log_level=warning",
                # DynaMO's allocation on the path (the default is uniform: no Allocate calls).
                "rollout.allocation=dynamic", "learner.algorithm.agg=prompt-mean",
                cwd=ROOT, wait=False,
            )  # fmt: skip
        redis = sync_client(redis_url, timeout_s=10.0)
        reward_metrics = f"{reward}/metrics"
        alloc_metrics_url = f"http://127.0.0.1:{alloc_metrics}/metrics"

        def reader_totals() -> dict[str, Any]:
            try:
                return json.loads(reader_stats.read_text())
            except (OSError, ValueError):
                return {"entries": 0, "responses": 0, "busy_s": 0.0, "reads": 0, "lags_tail": []}

        # Warm-up: every worker has pushed a batch (imports, tokenizer, connections), then a bit.
        deadline = time.monotonic() + args.start_timeout
        while True:
            for name, p in procs.items():
                if not p.alive():
                    raise RuntimeError(f"{name} died during warm-up:\n{p.log_tail()}")
            pushed = [
                _get(_scrape(u), "dynamo_rollout_batches_total") for u in _live(worker_metrics)
            ]
            if len(pushed) == fleet.workers and all(b >= 1 for b in pushed):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"fleet {fleet.label}: workers not all pushing after warm-up")
            time.sleep(0.5)
        time.sleep(args.warmup)

        def snapshot() -> dict[str, Any]:
            return {
                "t": time.monotonic(),
                "cpu": {name: _cpu_s(p.pid) for name, p in procs.items()},
                "workers": [_scrape(u) for u in worker_metrics],
                "allocator": _scrape(alloc_metrics_url),
                "reward": _scrape(reward_metrics),
                "reader": reader_totals(),
                "engines": httpx.get(urls[0] + "/stats", timeout=10).json(),
            }

        before = snapshot()
        depth: dict[str, list[float]] = {"reward": [], "stream_lag": [], "engine_in_flight": []}
        loads: list[float] = []
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            rs = _scrape(reward_metrics)
            depth["reward"].append(_get(rs, "dynamo_reward_queue_depth", kind="math"))
            depth["stream_lag"].append(float(_stream_lag(redis, namespace)))
            depth["engine_in_flight"].append(
                float(httpx.get(urls[0] + "/stats", timeout=10).json()["in_flight"])
            )
            loads.append(os.getloadavg()[0])
            time.sleep(0.5)
        after = snapshot()
        redis.close()
        for name, p in procs.items():
            if not p.alive():
                raise RuntimeError(f"{name} died during the measurement:\n{p.log_tail()}")
        out = summarise(fleet, args, before, after, depth)
        out["loadavg"] = sum(loads) / len(loads) if loads else 0.0
        return out
    finally:
        for p in reversed(list(procs.values())):
            p.stop(grace=5.0)


def _live(urls: list[str]) -> list[str]:
    import httpx

    out = []
    for u in urls:
        try:
            httpx.get(u, timeout=2.0)
            out.append(u)
        except httpx.HTTPError:
            pass
    return out


def _stream_lag(client: Any, namespace: str) -> int:
    import redis as redis_lib

    from dynamo_rl import keys
    from dynamo_rl.contracts.stream import lag_from_groups

    stream = keys.trajectory_stream(namespace)
    try:
        lag = lag_from_groups(client.xinfo_groups(stream), keys.learner_group(namespace))
    except redis_lib.ResponseError:
        return 0
    return lag if lag is not None else int(client.xlen(stream))


def summarise(
    fleet: Fleet, args: argparse.Namespace, before: dict, after: dict, depth: dict
) -> dict[str, Any]:
    wall = after["t"] - before["t"]
    rb, ra = before["reader"], after["reader"]
    responses = ra["responses"] - rb["responses"]
    entries = ra["entries"] - rb["entries"]
    capacity = fleet.engines * args.engine_tokens_per_s / args.max_tokens
    cores = {k: (after["cpu"][k] - before["cpu"][k]) / wall for k in after["cpu"]}
    cores["workers"] = sum(v for k, v in cores.items() if k.startswith("worker"))
    cores = {k: v for k, v in cores.items() if not k.startswith("worker") or k == "workers"}
    cores["total"] = (
        sum(v for k, v in cores.items() if k not in ("workers", "total")) + cores["workers"]
    )

    phases: dict[str, float] = {}
    batches = 0.0
    for wb, wa in zip(before["workers"], after["workers"], strict=True):
        batches += _get(wa, "dynamo_rollout_batches_total") - _get(
            wb, "dynamo_rollout_batches_total"
        )
        for phase in ("allocate", "generate", "verify", "push", "total"):
            name = "dynamo_rollout_batch_seconds_sum"
            phases[phase] = (
                phases.get(phase, 0.0) + _get(wa, name, phase=phase) - _get(wb, name, phase=phase)
            )
    per_batch = {p: (s / batches if batches else float("nan")) for p, s in phases.items()}

    def latency(svc: str, name: str, **labels: str) -> dict[str, float]:
        b, a = before[svc], after[svc]
        count = _get(a, f"{name}_count", **labels) - _get(b, f"{name}_count", **labels)
        total = _get(a, f"{name}_sum", **labels) - _get(b, f"{name}_sum", **labels)
        return {
            "calls_per_s": count / wall,
            "mean_ms": 1000 * total / count if count else float("nan"),
            "p99_ms_bucket": 1000 * _hist_quantile(b, a, name, 0.99, **labels),
        }

    lags = sorted(ra.get("lags_tail", [])[-max(1, entries) :])
    reads = ra["reads"] - rb["reads"]
    reader = {
        "read_ack_ms_per_call": 1000 * (ra["busy_s"] - rb["busy_s"]) / reads if reads else 0.0,
        # Its CPU time: the wall time above includes waiting for a core on a loaded machine.
        "read_ack_cpu_ms_per_call": (
            1000 * (ra.get("cpu_s", 0.0) - rb.get("cpu_s", 0.0)) / reads if reads else 0.0
        ),
        "busy_fraction": (ra["busy_s"] - rb["busy_s"]) / wall,
        "entries_per_read": entries / reads if reads else 0.0,
        "push_to_read_p50_s": lags[len(lags) // 2] if lags else float("nan"),
    }

    def avg(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    queues = {k: {"mean": avg(v), "max": max(v, default=0.0), "last": v[-1] if v else 0.0}
              for k, v in depth.items()}  # fmt: skip
    # A queue that keeps growing never drains in the last third of the window and averages more
    # there than in the first third (a queue that fills with each batch and drains is bursty,
    # not saturated).
    growing = {}
    for k, v in depth.items():
        third = max(1, len(v) // 3)
        growing[k] = bool(v) and min(v[-third:]) > 0 and avg(v[-third:]) > avg(v[:third])
    groups = entries
    return {
        "fleet": fleet.label,
        "engines": fleet.engines,
        "workers": fleet.workers,
        "wall_s": wall,
        "responses": responses,
        "responses_per_s": responses / wall,
        "groups_per_s": groups / wall,
        "engine_capacity_responses_per_s": capacity,
        "ratio_to_capacity": (responses / wall) / capacity,
        "batches": batches,
        "batch_phase_s": per_batch,
        "allocate_rpc": latency("allocator", "dynamo_allocator_request_latency_seconds",
                                method="Allocate"),
        "report_rpc": latency("allocator", "dynamo_allocator_request_latency_seconds",
                              method="ReportOutcomes"),
        "verify_http": latency("reward", "dynamo_reward_request_duration_seconds",
                               route="/v1/verify"),
        "reader": reader,
        "cores": cores,
        "queues": queues,
        "queue_growing": growing,
        "queue_samples": depth,
        # CPU cost per unit of work: the basis of the projection.
        "core_s_per_response": {k: v / (responses / wall) if responses else float("nan")
                                for k, v in cores.items()},
        "allocator_core_s_per_prompt": cores["allocator"] / (groups / wall) if groups else math.nan,
    }  # fmt: skip


# -- saturation and projection ---------------------------------------------------------------------

SERVICE_KEYS = ("redis", "allocator", "reward", "engines", "reader", "workers")


LATENCY_GROWTH = 3.0
"""A service whose latency reaches this multiple of its latency in the smallest fleet saturates."""


def _latency_ms(f: dict[str, Any], svc: str) -> float | None:
    if svc == "allocator":
        return f["allocate_rpc"]["mean_ms"]
    if svc == "reward":
        return f["verify_http"]["mean_ms"]
    if svc == "reader":
        return f["reader"]["read_ack_ms_per_call"]
    return None


def saturation(fleets: list[dict[str, Any]]) -> dict[str, str | None]:
    """The first fleet at which each service saturates (None: not within the fleets run): its CPU
    reaches ``SATURATED_CORES`` per process, its queue keeps growing, or its latency reaches
    ``LATENCY_GROWTH`` x the smallest fleet's. ``machine``: the first fleet during which the load
    average reached the number of cores. ``end_to_end``: the first fleet whose responses/s fall
    below 80 % of the engines' capacity relative to the best fleet before it (the first fleet is
    the reference: one worker's synchronous batches leave engines idle at any size)."""
    queue_of = {"reward": "reward", "reader": "stream_lag"}
    out: dict[str, str | None] = {}
    for svc in SERVICE_KEYS:
        out[svc] = None
        first = _latency_ms(fleets[0], svc) if fleets else None
        for f in fleets:
            # The workers are many processes: saturated when each uses SATURATED_CORES on average.
            per_proc = f["cores"][svc] / (f["workers"] if svc == "workers" else 1)
            q = queue_of.get(svc)
            lat = _latency_ms(f, svc)
            slow = bool(first and lat and lat >= LATENCY_GROWTH * first)
            if per_proc >= SATURATED_CORES or (q and f["queue_growing"][q]) or slow:
                out[svc] = f["fleet"]
                break
    cpus = os.cpu_count() or 1
    out["machine"] = next((f["fleet"] for f in fleets if f.get("loadavg", 0.0) >= cpus), None)
    out["end_to_end"] = None
    for i, f in enumerate(fleets[1:], start=1):
        best = max(g["ratio_to_capacity"] for g in fleets[:i])
        if f["ratio_to_capacity"] < 0.8 * best:
            out["end_to_end"] = f["fleet"]
            break
    return out


def replicas_for(n_gpus: int, core_s_per_unit: float, units_per_gpu_s: float, svc: str) -> int:
    """Replicas of ``svc`` a cluster of ``n_gpus`` needs: the CPU its load takes, at
    ``TARGET_UTILISATION`` of one replica's CPU limit (at least one)."""
    need = n_gpus * units_per_gpu_s * core_s_per_unit
    return max(1, math.ceil(need / (REPLICA_CORES[svc] * TARGET_UTILISATION)))


def projection(fleets: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per-core costs, from the fleet that moved the most responses (its idle overheads — health
    pings, polls — weigh least), and the sizing table for the paper's recipe."""
    busiest = max(fleets, key=lambda f: f["responses_per_s"])
    reward_cost = busiest["core_s_per_response"]["reward"]
    alloc_cost = busiest["allocator_core_s_per_prompt"]
    # The workers (engine JSON in, protobuf out) and the reader (decode) pay per token.
    per_token = {
        k: busiest["core_s_per_response"][k] / args.max_tokens for k in ("workers", "reader")
    }
    gpu_rps = args.gpu_tokens_per_s / args.gpu_response_tokens
    rows = []
    for n in CLUSTER_GPUS:
        rps = n * gpu_rps
        rows.append(
            {
                "gpus": n,
                "responses_per_s": rps,
                "step_generation_s": RESPONSES_PER_STEP / rps,
                "reward_cores": rps * reward_cost,
                "reward_replicas": replicas_for(n, reward_cost, gpu_rps, "reward"),
                "allocator_cores": rps / (RESPONSES_PER_STEP / PROMPTS_PER_STEP) * alloc_cost,
                "allocator_replicas": replicas_for(
                    n, alloc_cost, gpu_rps * PROMPTS_PER_STEP / RESPONSES_PER_STEP, "allocator"
                ),
                "worker_cores": n * args.gpu_tokens_per_s * per_token["workers"],
                "reader_cores": n * args.gpu_tokens_per_s * per_token["reader"],
            }
        )
    return {
        "gpu_tokens_per_s": args.gpu_tokens_per_s,
        "gpu_response_tokens": args.gpu_response_tokens,
        "gpu_responses_per_s": gpu_rps,
        "reward_core_s_per_response": reward_cost,
        "allocator_core_s_per_prompt": alloc_cost,
        "worker_core_s_per_token": per_token["workers"],
        "reader_core_s_per_token": per_token["reader"],
        "replica_cores": REPLICA_CORES,
        "target_utilisation": TARGET_UTILISATION,
        "from_fleet": busiest["fleet"],
        "rows": rows,
    }


def sizing_markdown(proj: dict[str, Any]) -> str:
    """The sizing table as docs/deploy.md carries it (a test checks the two agree)."""
    lines = [
        "| engine GPUs | responses/s | generation per 8,192-response step | reward cores "
        "| reward replicas | allocator cores | allocator replicas | rollout worker cores "
        "| stream reader cores (learner rank 0) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in proj["rows"]:
        lines.append(
            f"| {r['gpus']} | {r['responses_per_s']:.0f} | {r['step_generation_s']:.1f} s "
            f"| {r['reward_cores']:.2f} | {r['reward_replicas']} | {r['allocator_cores']:.2f} "
            f"| {r['allocator_replicas']} | {r['worker_cores']:.1f} | {r['reader_cores']:.2f} |"
        )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------------


def _dataset(path: Path, n: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {i} mod {ANSWERS}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i % ANSWERS)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def print_fleet(f: dict[str, Any]) -> None:
    ph = f["batch_phase_s"]
    print(
        f"== fleet {f['fleet']} ({f['engines']} engines, {f['workers']} workers), "
        f"{f['wall_s']:.0f} s measured"
    )
    print(
        f"  responses/s   {f['responses_per_s']:8.1f}  (engines' capacity "
        f"{f['engine_capacity_responses_per_s']:.1f}/s, ratio {f['ratio_to_capacity']:.2f})"
    )
    total = ph.get("total") or float("nan")
    print(
        "  batch phases  "
        + ", ".join(
            f"{p} {ph[p]:.2f}s ({100 * ph[p] / total:.0f}%)"
            for p in ("allocate", "generate", "verify", "push")
        )
        + f"; total {total:.2f}s over {f['batches']:.0f} batches"
    )
    a, v, r = f["allocate_rpc"], f["verify_http"], f["reader"]
    print(
        f"  services      Allocate {a['mean_ms']:.1f} ms mean (p99 <= {a['p99_ms_bucket']:.0f}); "
        f"/v1/verify {v['mean_ms']:.0f} ms mean (p99 <= {v['p99_ms_bucket']:.0f}); "
        f"stream read+ack {r['read_ack_ms_per_call']:.1f} ms/call "
        f"({r.get('read_ack_cpu_ms_per_call', 0.0):.1f} ms of CPU), "
        f"{r['entries_per_read']:.1f} groups/call"
    )
    print("  CPU (cores)   " + ", ".join(f"{k} {v:.2f}" for k, v in f["cores"].items()))
    print(
        "  queues        "
        + ", ".join(
            f"{k} mean {q['mean']:.1f} max {q['max']:.0f}"
            + (" GROWING" if f["queue_growing"][k] else "")
            for k, q in f["queues"].items()
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role")
    eng = sub.add_parser("engines", help="(internal) serve simulated engines")
    eng.add_argument("--count", type=int, required=True)
    eng.add_argument("--ports", required=True)
    eng.add_argument("--tokens-per-s", type=float, required=True)
    eng.add_argument("--seed", type=int, default=0)
    eng.add_argument("--symbolic", type=float, default=0.0)
    rd = sub.add_parser("reader", help="(internal) read and acknowledge the stream")
    rd.add_argument("--redis-url", required=True)
    rd.add_argument("--namespace", required=True)
    rd.add_argument("--stats", required=True)
    rd.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--fleets", default="8x1,32x4,128x16", help="ENGINESxWORKERS, comma-separated")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds measured per fleet")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after every worker pushed")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument(
        "--engine-tokens-per-s",
        type=float,
        default=2000.0,
        help="decode rate of one simulated engine (all its requests together)",
    )
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per response")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per worker batch")
    ap.add_argument("--n", type=int, default=8, help="responses per prompt on average (DRA)")
    ap.add_argument(
        "--symbolic",
        type=float,
        default=0.05,
        help="fraction of responses whose answer needs math-verify (a fraction)",
    )
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--gpu-tokens-per-s",
        type=float,
        default=5000.0,
        help="projection: decode tokens/s of one GPU engine",
    )
    ap.add_argument(
        "--gpu-response-tokens",
        type=float,
        default=1024.0,
        help="projection: mean response length on the cluster",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fleet.json"))
    ap.add_argument("--quick", action="store_true",
                    help="one small fleet (2 engines, 1 worker, 4 s): the smoke test")  # fmt: skip
    args = ap.parse_args(argv)
    if args.role == "engines":
        return serve_engines(args)
    if args.role == "reader":
        return run_reader(args)
    import signal

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # the fleets' finally blocks stop every process started

    signal.signal(signal.SIGTERM, stop)
    if args.quick:
        args.fleets, args.duration, args.warmup = "2x1", 4.0, 0.5
        args.batch_size, args.n, args.max_tokens, args.prompts = 4, 4, 16, 64
    fleets = parse_fleets(args.fleets)

    from learner.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    model = build_tiny_model(tmp / "model", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    data = _dataset(tmp / "train.parquet", args.prompts)
    results = []
    for fleet in fleets:
        f = run_fleet(fleet, args, model, data)
        print_fleet(f)
        results.append(f)
    sat = saturation(results)
    proj = projection(results, args)
    print("== saturation (first fleet at which it saturates; '-': not within the fleets run)")
    print("  " + ", ".join(f"{k} {v or '-'}" for k, v in sat.items()))
    print(
        f"== projection: {RESPONSES_PER_STEP} responses/step, a GPU at "
        f"{args.gpu_tokens_per_s:.0f} tok/s x {args.gpu_response_tokens:.0f}-token responses "
        f"= {proj['gpu_responses_per_s']:.2f} responses/s; reward "
        f"{1000 * proj['reward_core_s_per_response']:.2f} core-ms/response, allocator "
        f"{1000 * proj['allocator_core_s_per_prompt']:.3f} core-ms/prompt"
    )
    for row in proj["rows"]:
        print(
            f"  {row['gpus']:5d} GPUs: {row['responses_per_s']:8.0f} responses/s, step "
            f"{row['step_generation_s']:7.1f} s; reward {row['reward_cores']:6.1f} cores -> "
            f"{row['reward_replicas']} replicas; allocator {row['allocator_cores']:5.2f} cores "
            f"-> {row['allocator_replicas']} replicas"
        )
    print(sizing_markdown(proj))
    report = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("role", "out")},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "fleets": results,
        "saturation": sat,
        "projection": proj,
    }
    out = Path(args.out)
    # The machine record joins "machine"'s cpus and load average (write_result).
    write_result(out, report, indent=1, default=float)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
