"""The vLLM worker extension of a warm pool's engines: OpenRLHF 0.10.4's ``WorkerWrap`` (weight updates from the
actor) plus the two calls a warm trial's reset makes through ``collective_rpc`` (``warm_server.py``):

- ``autorl_reseed(seed)``: the worker's generators seeded as ``Worker.init_device`` seeds a fresh engine's
  (vLLM's ``set_random_seed``: Python, NumPy, torch and the device);
- ``autorl_digest()``: sha256 of three of the loaded weights (the first, a middle and the last parameter), so the
  pool can check that a reload gave back the base checkpoint's weights.

Imported only inside an engine's worker process (vLLM, torch and openrlhf are there).
"""

from __future__ import annotations

import hashlib

from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap


class WarmWorker(WorkerWrap):
    def autorl_reseed(self, seed: int) -> int:
        from vllm.utils.torch_utils import set_random_seed  # vLLM 0.22 path; only a worker calls it

        set_random_seed(seed)
        return seed

    def autorl_digest(self) -> str:
        params = list(self.model_runner.model.named_parameters())
        digest = hashlib.sha256()
        for name, tensor in (params[0], params[len(params) // 2], params[-1]):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()
