"""A packed trial's vLLM engine gets a fixed KV-cache share inside its Ray workers (``vllm_share``).

vLLM cannot run here (no GPU), so its engine-arguments module is stood in for by a small package of the same
name and shape (a dataclass ``EngineArgs`` with ``__post_init__`` and ``kv_cache_memory_bytes``, and
``vllm.platforms.current_platform``): what is tested is the hook's import interception, in a fresh interpreter
and in the actor of a real Ray job. The real engine took the value on an H200 (benchmarks/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autorl.backends.openrlhf import vllm_share
from autorl.backends.openrlhf.backend import OpenRLHFBackend, packed_env
from autorl.backends.openrlhf.params import OpenRLHFParams

CARD = 80 * 2**30
ARG_UTILS = """
from dataclasses import dataclass

@dataclass
class EngineArgs:
    model: str = "m"
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None

    def __post_init__(self):
        self.checked = True

@dataclass
class AsyncEngineArgs(EngineArgs):
    pass
"""
PLATFORMS = f"""
class _Platform:
    @classmethod
    def get_device_total_memory(cls, device_id=0):
        return {CARD}

current_platform = _Platform()
"""


def _fake_vllm(root: Path) -> Path:
    for sub, text in (
        ("vllm/__init__.py", ""),
        ("vllm/engine/__init__.py", ""),
        ("vllm/engine/arg_utils.py", ARG_UTILS),
        ("vllm/platforms/__init__.py", PLATFORMS),
    ):
        (root / sub).parent.mkdir(parents=True, exist_ok=True)
        (root / sub).write_text(text)
    return root


PROBE = """
import json, sys
from autorl.backends.openrlhf import vllm_share
vllm_share.setup()
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
given = EngineArgs(kv_cache_memory_bytes=123)
print(json.dumps({"async": AsyncEngineArgs().kv_cache_memory_bytes, "plain": EngineArgs().kv_cache_memory_bytes,
                  "given": given.kv_cache_memory_bytes, "checked": AsyncEngineArgs().checked,
                  "finders": sum(type(f).__name__ == "_Finder" for f in sys.meta_path)}))
"""


def _probe(tmp_path: Path, fraction: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != vllm_share.ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(_fake_vllm(tmp_path / "site")), str(Path(__file__).resolve().parents[3])])
    if fraction is not None:
        env[vllm_share.ENV] = fraction
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_engine_given_no_size_gets_the_fraction_of_its_card(tmp_path):
    seen = _probe(tmp_path, "0.0750")
    assert seen["async"] == seen["plain"] == int(0.075 * CARD)
    assert seen["given"] == 123  # a size the engine was given stays
    assert seen["checked"] is True  # vLLM's own checks still run
    assert seen["finders"] == 0  # the finder leaves once it found the module


@pytest.mark.parametrize("fraction", [None, "0", "1.5", "abc", "nan"])
def test_no_fraction_or_a_bad_one_leaves_vllm_alone(tmp_path, fraction):
    seen = _probe(tmp_path, fraction)
    assert seen["async"] is None and seen["plain"] is None and seen["finders"] == 0


def test_only_a_packed_trial_asks_for_the_share():
    params = OpenRLHFParams(pretrain="m", prompt_data="p", vllm_gpu_memory_utilization=0.15)
    assert packed_env(0.25, params) == {vllm_share.ENV: "0.0750"}  # half the engine's share of the card
    assert packed_env(0, params) == {} and packed_env(1, params) == {} and packed_env(2, params) == {}
    unset = OpenRLHFParams(pretrain="m", prompt_data="p")
    assert packed_env(0.5, unset) == {vllm_share.ENV: "0.2250"}  # 0.9 of the card split two ways, halved


def test_the_job_of_a_packed_trial_ships_autorl_and_names_the_hook():
    from autorl.backends.openrlhf.cluster import autorl_package, shipped_with

    backend = OpenRLHFBackend()
    assert shipped_with(backend, {vllm_share.ENV: "0.0750"}) == ([autorl_package()], vllm_share.HOOK)
    assert shipped_with(backend, {vllm_share.ENV: "0"}) == (None, None)  # the user turned it off
    assert shipped_with(backend, {}) == (None, None)


ACTOR_JOB = """
import json, ray
ray.init(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}})  # as OpenRLHF's driver does: merged with the job's

@ray.remote(num_cpus=0)
class Engine:  # OpenRLHF builds its vLLM engine arguments inside an actor like this
    def kv_bytes(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        return AsyncEngineArgs().kv_cache_memory_bytes

print("RESULT", json.dumps(ray.get(Engine.remote().kv_bytes.remote())), flush=True)
"""


@pytest.mark.slow
def test_a_real_ray_job_runs_the_hook_in_its_workers(tmp_path):
    from autorl.backends.ray_jobs import LocalRayHead, runtime_env_for, submit

    work = _fake_vllm(tmp_path / "work")  # the job's working folder is every worker's first path entry
    (work / "job.py").write_text(ACTOR_JOB)
    from autorl.backends.openrlhf.cluster import autorl_package

    with LocalRayHead(num_cpus=2, num_gpus=0, object_store_bytes=80 * 1024 * 1024) as head:
        assert runtime_env_for(work, {}, None, vllm_share.HOOK)["worker_process_setup_hook"] == vllm_share.HOOK
        handle = submit(
            head.address,
            [sys.executable, "job.py"],
            working_dir=work,
            log_path=tmp_path / "job.log",
            env={vllm_share.ENV: "0.1"},
            py_modules=[autorl_package()],
            setup_hook=vllm_share.HOOK,
        )
        deadline = time.time() + 120
        while handle.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        log = (tmp_path / "job.log").read_text()
    assert handle.poll() == 0, log[-2000:]
    assert f"RESULT {int(0.1 * CARD)}" in log
