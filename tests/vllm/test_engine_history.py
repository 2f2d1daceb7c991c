"""A vLLM engine's history in the run folder: what ``dynamo-rl vllm-server`` records
(:func:`services.engine.vllm_server.record_history`) from a real vLLM server — its own ``/metrics``
series and the weight version — drawn by the dashboard's engine charts after the server is gone."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from dashboard.server import Dashboard
from dashboard.sources import JsonlLog, RunFolder, SampleReader, Scraper
from dynamo_rl.config import load_config
from dynamo_rl.contracts.weight_control import VLLMWeights, read_version
from dynamo_rl.metrics import VLLM_SERIES, read_history
from services.engine.vllm_server import record_history
from tests.vllm.conftest import VLLMServers, completions

pytestmark = pytest.mark.vllm


def test_vllm_engine_history_reaches_the_run_folder_and_the_charts(
    vllm_servers: VLLMServers, tmp_path: Path
) -> None:
    server = vllm_servers.get()
    port = urlparse(server.url).port
    cfg = load_config(None, [f"run.dir={tmp_path}", f"engine.port={port}",
                             "run.history.interval_s=3600"], env={})  # fmt: skip
    history = record_history(cfg, server.url)  # one snapshot at once; the rest by hand
    assert history is not None and history.path.name == f"engine-{port}.jsonl"
    out = completions(server.url, [[5, 6, 7, 8]], max_tokens=12, temperature=1.0, n=3)
    generated = sum(len(c["token_ids"]) for c in out)

    def total(line: dict, name: str) -> float:
        return sum(v for n, _labels, v in line["samples"] if n == name)

    # vLLM may count a request's tokens just after answering it: wait for the count, then record.
    before = total(read_history(history.path)[0], "vllm:generation_tokens_total")
    deadline = time.monotonic() + 60
    while total({"samples": history.metrics.snapshot() or []},
                "vllm:generation_tokens_total") < before + generated:  # fmt: skip
        assert time.monotonic() < deadline, "vLLM's token counter never caught up"
        time.sleep(0.2)
    history.write_once()
    history.stop()
    lines = read_history(history.path)
    assert len(lines) >= 2 and {ln["service"] for ln in lines} == {"engine"}

    names = {n for n, _labels, _v in lines[-1]["samples"]}
    assert set(VLLM_SERIES) <= names, sorted(set(VLLM_SERIES) - names)
    tokens = total(lines[1], "vllm:generation_tokens_total") - total(
        lines[0], "vllm:generation_tokens_total"
    )
    assert tokens == generated
    version = read_version(VLLMWeights(), server.url)
    assert total(lines[-1], "dynamo_engine_weight_version") == version

    (tmp_path / "summary.json").write_text(json.dumps({}))  # read as a finished run
    dash = Dashboard(log=JsonlLog(None), scraper=Scraper([]),
                     samples=SampleReader("redis://127.0.0.1:1/0", "x"), run_name="x",
                     run=RunFolder(tmp_path))  # fmt: skip
    charts = {c["id"]: c for c in dash.charts_payload()["charts"]}
    for chart in ("tokens", "engine_batch", "engine_weights"):
        labels = [ln["label"] for ln in charts[chart]["lines"] if ln["points"]]
        assert labels == [f"engine-{port}"], (chart, charts[chart]["lines"])
    rate = charts["tokens"]["lines"][0]["points"]
    assert rate and rate[0][1] > 0
