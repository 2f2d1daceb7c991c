"""The ``model`` kind: a Hugging Face sequence-classification reward model scores (prompt, response).

The model runs in a worker process per ``reward.models.<name>``
(:mod:`services.reward_model.worker`, JSON lines over pipes) because this service imports no
torch. Here, :class:`ModelClient` gathers pairs from concurrent items into batches (up to
``batch_size``, waiting at most ``batch_wait_ms`` for the batch to fill) and sends one batch at a
time. A batch that fails or outlives ``score_timeout_s`` scores its items 0 with reason
``model_error``; a dead or killed worker is restarted before the next batch.

The result's ``score`` is the normalised score (``sigmoid((raw - shift) / scale)`` by default),
``raw_score`` the model's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass

from dynamo_rl.config import RewardConfig
from dynamo_rl.config.reward import RewardModelSpec
from dynamo_rl.contracts.reward import ItemResult, ModelItem
from services.reward.base import NamedScorer
from services.reward.metrics import RewardMetrics

log = logging.getLogger("services.reward")

WORKER_MODULE = "services.reward_model.worker"


class ModelError(Exception):
    """The worker could not score a batch (its message says why)."""


@dataclass
class ModelScore:
    raw: float
    normalised: float


def normalise(spec: RewardModelSpec, raw: float) -> float:
    if spec.normalize == "none":
        return raw
    z = (raw - spec.shift) / spec.scale
    # Split by sign so exp never overflows.
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class ModelClient:
    """One reward-model worker process and the batching in front of it."""

    def __init__(self, name: str, spec: RewardModelSpec, metrics: RewardMetrics) -> None:
        self.name, self.spec, self.metrics = name, spec, metrics
        self._proc: asyncio.subprocess.Process | None = None
        self._queue: asyncio.Queue[tuple[list[str], asyncio.Future[float]]] = asyncio.Queue()
        self._batcher: asyncio.Task[None] | None = None

    def _argv(self) -> list[str]:
        s = self.spec
        return [
            sys.executable, "-m", WORKER_MODULE, "--path", s.path, "--device", s.device,
            "--dtype", s.dtype, "--max-length", str(s.max_length), "--template", s.template,
            "--threads", str(s.threads),
        ]  # fmt: skip

    async def _spawn(self) -> None:
        key = f"reward.models.{self.name}"
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), self.spec.load_timeout_s)
        except TimeoutError:
            self._kill()
            raise RuntimeError(
                f"{key}: the reward model did not load within {self.spec.load_timeout_s}s "
                f"({key}.load_timeout_s)"
            ) from None
        hello = json.loads(line) if line.strip() else {"error": "worker exited while loading"}
        if not hello.get("ready"):
            self._kill()
            raise RuntimeError(
                f"{key}.path: cannot load a reward model from {self.spec.path!r}: "
                f"{hello.get('error')}"
            )
        log.info("reward model %r loaded from %s on %s", self.name, self.spec.path, hello["device"])

    def _kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()

    async def start(self) -> None:
        await self._spawn()
        self._batcher = asyncio.create_task(self._run_batches())

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        self._kill()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                await self._proc.wait()

    async def score(self, prompt: str, response: str) -> ModelScore:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        await self._queue.put(([prompt, response], fut))
        raw = await fut
        return ModelScore(raw, normalise(self.spec, raw))

    async def _next_batch(self) -> list[tuple[list[str], asyncio.Future[float]]]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.spec.batch_wait_ms / 1000
        while len(batch) < self.spec.batch_size:
            left = deadline - time.monotonic()
            try:
                batch.append(
                    self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(
                        self._queue.get(), left)
                )  # fmt: skip
            except (TimeoutError, asyncio.QueueEmpty):
                break
        return batch

    async def _run_batches(self) -> None:
        while True:
            batch = await self._next_batch()
            try:
                scores = await self._send([pair for pair, _ in batch])
            except asyncio.CancelledError:
                for _, fut in batch:
                    fut.cancel()
                raise
            except Exception as e:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(ModelError(str(e)))
                continue
            self.metrics.model_batch_size.labels(self.name).observe(len(batch))
            for (_, fut), raw in zip(batch, scores, strict=True):
                if not fut.done():
                    fut.set_result(raw)

    async def _send(self, pairs: list[list[str]]) -> list[float]:
        if self._proc is None or self._proc.returncode is not None:
            log.warning("reward model %r worker is gone; restarting it", self.name)
            self.metrics.model_worker_restarts.labels(self.name).inc()
            await self._spawn()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps({"pairs": pairs}) + "\n").encode())
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), self.spec.score_timeout_s)
        except TimeoutError:
            self._kill()
            raise ModelError(
                f"batch of {len(pairs)} not scored within {self.spec.score_timeout_s}s "
                f"(reward.models.{self.name}.score_timeout_s); worker restarted"
            ) from None
        except (BrokenPipeError, ConnectionResetError):
            self._kill()
            raise ModelError("reward-model worker died") from None
        if not line:
            self._kill()
            raise ModelError("reward-model worker died")
        answer = json.loads(line)
        if "error" in answer:
            raise ModelError(answer["error"])
        scores = answer["scores"]
        if len(scores) != len(pairs):
            raise ModelError(f"worker answered {len(scores)} scores for {len(pairs)} pairs")
        return [float(x) for x in scores]


class ModelScorer(NamedScorer):
    kind = "model"
    item_model = ModelItem
    field = "model"

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        self.clients = {name: ModelClient(name, spec, metrics) for name, spec in cfg.models.items()}

    async def start(self) -> None:
        await asyncio.gather(*(c.start() for c in self.clients.values()))

    async def score(self, item: ModelItem) -> ItemResult:
        name = self.entry(item)
        start = time.monotonic()
        try:
            s = await self.clients[name].score(item.prompt, item.response)
        except ModelError as e:
            return ItemResult(
                id=item.id, score=0.0, correct=False, format_ok=True, reason="model_error",
                detail=f"reward model {name!r}: {e}",
            )  # fmt: skip
        finally:
            self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - start)
        correct = s.normalised >= self.cfg.models[name].correct_above
        return ItemResult(
            id=item.id, score=s.normalised, correct=correct, format_ok=True,
            reason="ok" if correct else "wrong_answer", raw_score=s.raw,
            detail=f"model {name!r}: raw {s.raw:.6g}",
        )  # fmt: skip
