"""The learner's vLLM-shaped calls, as the plugin's gloo backend parses them (in vLLM's own
environment, no server): ``init_info`` and ``update_info`` built by the engine contract fit the
plugin's dataclasses, and the plugin's flat-bucket layout is the contract's very file."""

from __future__ import annotations

import json
import subprocess

import pytest

from dynamo_rl.contracts.weight_control import VLLMWeights
from tests.vllm.conftest import PLUGIN_DIR, REPO, VLLM_PYTHON, require_vllm_env

pytestmark = pytest.mark.vllm

CHECK = """
import json, sys
from pathlib import Path
from dynamo_rl_vllm_plugin import gloo, weight_layout
calls = json.loads(sys.argv[1])
init = gloo.GlooInitInfo(**calls["init"])
update = gloo.GlooUpdateInfo(**calls["update"])
print(json.dumps({
    "init": [init.master_address, init.master_port, init.world_size, init.rank_offset,
             init.bucket_bytes, init.timeout_s],
    "names": update.names,
    "layout": str(Path(weight_layout.__file__).resolve()),
    "plugin": str(Path(gloo.__file__).resolve()),
}))
"""


def test_plugin_parses_the_contracts_calls() -> None:
    require_vllm_env()
    proto = VLLMWeights()
    init = proto.init_group(
        master_address="127.0.0.1", master_port=29511, rank_offset=1, world_size=2,
        group_name="ignored", backend="gloo", bucket_bytes=1 << 20, timeout_s=42.0,
    )  # fmt: skip
    update = proto.update(
        names=["a", "b"], dtypes=["float32", "bfloat16"], shapes=[[2, 3], [4]],
        group_name="ignored", weight_version=3,
    )  # fmt: skip
    assert init.body is not None and update.body is not None
    calls = {"init": init.body["init_info"], "update": update.body["update_info"]}
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", CHECK, json.dumps(calls)],
        capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(PLUGIN_DIR)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["init"] == ["127.0.0.1", 29511, 2, 1, 1 << 20, 42.0]
    assert got["names"] == ["a", "b"]
    assert got["plugin"] == str((PLUGIN_DIR / "dynamo_rl_vllm_plugin" / "gloo.py").resolve())
    assert got["layout"] == str((REPO / "dynamo_rl" / "contracts" / "weight_layout.py").resolve())
