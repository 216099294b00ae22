"""The OpenRLHF backend: GRPO trials as ``openrlhf.cli.train_ppo_ray`` Ray jobs.

``OpenRLHFParams`` (``params.py``) is the recipe's ``train`` block for this backend. ``plan``
turns it into the exact ``train_ppo_ray`` argv for the target OpenRLHF version
(flat or dotted flags, see ``openrlhf_flags``), with the environment the metrics
patch reads (``METRICS_LOG_DIR`` and friends). ``start`` submits the plan as a
Ray job, to ``ray_address`` or to a private local head that the backend starts
on first use and stops in ``close()``.

Seed 004's 8xH100 setup is the reference: actor on 4 GPUs with ZeRO-3 and LoRA,
2 vLLM engines x TP=2, GRPO through ``--advantage_estimator group_norm``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from autorl.backends import forked
from autorl.backends.base import Backend, LaunchPlan, OomKnob, TrialSpec, gpu_count
from autorl.backends.openrlhf import caches, checks, cluster, warm
from autorl.backends.openrlhf import preflight as preflight_checks
from autorl.backends.openrlhf.flags import FLAG_BY_FIELD, to_args
from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.params import OpenRLHFParams
from autorl.backends.openrlhf.vllm_share import ENV, fraction_for
from autorl.backends.ray_jobs import PrivateHead, submit
from autorl.errors import RecipeError
from autorl.evaluate import ProbeSettings, eval_argv

METRICS_FORMAT = "openrlhf"
NOT_FLAGS = {
    "openrlhf_version",
    "extra_args",
    "eval_split_names",
    "entrypoint_num_gpus",
    "pool_size",
    "checkpoint_gb",
    "vllm_in_process",
    "warm_pool",
    *ProbeSettings.model_fields,
}
REWARD_WRAPPER = Path(__file__).with_name("reward_func.py")
BUILTIN_REWARD = "builtin:exact_match"
FINAL_MODEL = "model"  # <run_dir>/model: the final weights (or LoRA adapter) when the recipe names no save_path


def installed_version() -> str | None:
    """The installed openrlhf version, or None."""
    try:
        return metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return None


def target_version(params: OpenRLHFParams) -> str:
    """The OpenRLHF version the argv is written for."""
    version = params.openrlhf_version or installed_version()
    if version is None:
        raise RecipeError(
            "openrlhf is not installed here: set train.openrlhf_version to the cluster's version (e.g. 0.10.4)"
        )
    return version


def build_argv(params: OpenRLHFParams, run_name: str, tensorboard_dir: str, python: str = "python") -> list[str]:
    """The full ``train_ppo_ray`` argv for ``params`` in its target version's dialect."""
    version = target_version(params)
    values = params.model_dump()
    values.update(run_name=run_name, tensorboard_dir=tensorboard_dir)
    if values["kl_coef"] > 0:
        values["ref_num_nodes"] = params.ref_num_nodes or params.actor_num_nodes
        values["ref_num_gpus_per_node"] = params.ref_num_gpus_per_node or params.actor_num_gpus_per_node
    argv = [python, "-m", "openrlhf.cli.train_ppo_ray"]
    for field in FLAG_BY_FIELD:
        argv += to_args(field, values.get(field), version)
    return argv + list(params.extra_args)


class OpenRLHFBackend(Backend):
    """Plans ``train_ppo_ray`` runs and submits them as Ray jobs."""

    name = "openrlhf"
    runs_on_ray = True
    oom_knobs = (
        OomKnob(("micro_train_batch_size",)),
        OomKnob(("gens",), floor=2),
        OomKnob(("max_new_tokens", "generate_max_len")),
    )
    work_keys = ("gens", "max_new_tokens", "rollout_batch_size", "num_episodes", "max_samples")
    steps_key, episodes_key = None, "num_episodes"  # a run is sized by episodes over its prompt pool

    def __init__(
        self, ray_address: str | None = None, extra_env: dict[str, str] | None = None, python: str | None = None
    ):
        super().__init__(ray_address, extra_env)
        self.python = python or ("python" if ray_address else sys.executable)
        self._head = PrivateHead()  # used only without a Ray address
        self._cache: Path | None = None  # the jobs' compile caches on a local head (set by prepare: caches.py)
        self._per_gpu = 1  # trials packed on one GPU (recipe gpus_per_trial = 1 / this; set by prepare)
        self._pools: warm.WarmPools | None = None  # the study's warm pools (set by prepare when a recipe asks)

    def check(self, recipe, root: Path) -> None:
        """Fail before any Ray job starts, with one line: a missing model or probe file, a flag the installed
        OpenRLHF lacks, a GPU share that cannot be packed (``checks.py``)."""
        found = warm_problem(recipe.params, bool(self.ray_address))
        found = found or checks.problem(recipe, Path(root), installed_version(), on_cluster=bool(self.ray_address))
        if not found and self.ray_address:  # what the nodes have: a short job sees it (cluster.py)
            params = recipe.params
            found = cluster.check(
                self.ray_address,
                self.python,
                cluster.job_paths(params, Path(root)),
                Path(root) / ".autorl" / "cluster-check",
                target_version(params),
                self.extra_env,
            )
        if found:
            raise RecipeError(found)

    def warnings(self, recipe, root: Path) -> list[str]:
        """A tokenizer that adds special tokens OpenRLHF's rollout prompts go without (``checks.warnings``); the
        model of a job on a cluster is not looked at here."""
        return [] if self.ray_address else checks.warnings(recipe.params, Path(root))

    def preflight(self, recipe, worktree: Path) -> str:
        """The failed preflight checks (steps, LR at step 20, disk, patches, GPUs) as one line."""
        checked = preflight_checks.preflight(recipe, worktree=worktree)
        return "; ".join(f"{c.name}: {c.detail}" for c in checked if c.ok is False)

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        """The argv, env and paths of one trial; writes nothing."""
        params = trial_params(spec)
        run_dir = Path(spec.run_dir).resolve()
        tb_root = params.tensorboard_dir or str(run_dir / "tensorboard")
        wrapper = run_dir / REWARD_WRAPPER.name if self.ray_address else REWARD_WRAPPER  # copied there by start
        wrapped, reward_env = wrap_reward(absolute_files(params, Path(spec.worktree)), Path(spec.worktree), wrapper)
        argv = build_argv(wrapped, spec.attempt, tb_root, self.python)
        env = {
            **packed_env(spec.recipe.gpus_per_trial, params),
            **self.extra_env,
            **run_env(run_dir),
            **reward_env,
            **self._cache_env(),
            **engine_env(params),
            "AUTORL_TENSORBOARD_DIR": str(Path(tb_root) / spec.attempt),
        }
        return LaunchPlan(
            argv=argv,
            env=env,
            pool_key=pool_key(params, env) if params.warm_pool and not self.ray_address else None,
            cwd=str(spec.worktree),
            log_path=str(run_dir / "train.log"),
            metrics_path=env["METRICS_LOG_DIR"] + "/training_metrics.jsonl",
            metrics_format=METRICS_FORMAT,
            metric_map=eval_metric_map(params),
            backend=self.name,
            ray_address=self.ray_address,
            resources={"entrypoint_num_gpus": params.entrypoint_num_gpus},
        )

    def planned_steps(self, recipe) -> int:
        """Global steps of a run whose prompt pool is capped by max_samples (0 when the pool is not capped)."""
        return final_step(recipe.params)

    def eval_plan(self, spec: TrialSpec) -> LaunchPlan | None:
        """``python -m autorl.evaluate`` on the model the trial saved; None when the recipe has no probe set."""
        params = trial_params(spec)
        if not params.probe_splits():
            return None
        run_dir = Path(spec.run_dir).resolve()
        probe = params.model_copy(
            update={
                k: str(Path(spec.worktree, v).resolve())
                for k, v in (("probe_id", params.probe_id), ("probe_ood", params.probe_ood))
                if v
            }
        )
        assert params.save_path is not None, "trial_params sets it"
        model = Path(spec.worktree, params.save_path).resolve()
        base = str(Path(spec.worktree, params.pretrain).resolve()) if params.lora_rank else None
        limit = params.max_new_tokens or params.generate_max_len or 64
        argv = eval_argv(
            sys.executable,
            model,
            run_dir / "eval.jsonl",
            probe,
            limit,
            base,
            final_step(params),
            params.seed or 0,
            chat=params.apply_chat_template,
            special=False,
        )
        return LaunchPlan(
            argv=argv,
            env=self._eval_env(),
            cwd=str(spec.worktree),
            log_path=str(run_dir / "train.log"),  # appended: triage reads one log
            metrics_path=str(run_dir / "eval.jsonl"),
            backend=self.name,
        )

    def checkpoint_eval_values(self, every: int) -> dict[str, Any]:
        """Hugging Face checkpoints every ``every`` steps (no DeepSpeed state: nothing resumes from them), each
        evaluated by the per-item evaluator as the run trains (``checkpoint_glob``)."""
        return {"save_steps": every, "save_hf_ckpt": True, "disable_ds_ckpt": True}

    def checkpoint_glob(self, spec: TrialSpec) -> str | None:
        """OpenRLHF 0.10's Hugging Face checkpoints (``<ckpt.path>/global_step<N>_hf``, written every
        ``save_steps`` with ``save_hf_ckpt``: a recipe's ``full`` block turns them on); None without them or without
        probe sets. Their evaluator runs beside the training job on its GPUs (its vLLM share 0.3, else HF)."""
        params = trial_params(spec)
        if not (params.save_hf_ckpt and (params.save_steps or 0) > 0 and params.probe_splits()):
            return None
        if params.ckpt_path is None:  # trial_params sets it wherever save_hf_ckpt is on
            return None
        return str(Path(spec.worktree, params.ckpt_path).resolve() / "global_step*_hf")

    def gpus_per_run(self, recipe) -> float:
        """The recipe's ``gpus_per_trial`` when it packs trials on shared GPUs, else its layout's GPUs (actor,
        reference and vLLM engines; the largest of them when colocated)."""
        return recipe.gpus_per_trial or float(recipe.params.gpus_needed())

    def _cache_env(self) -> dict[str, str]:
        """DeepSpeed's op builds, Triton's kernels and vLLM's compile cache in this machine's shared folder
        (``caches.py``), on the local head only (a cluster's nodes do not see this machine's folders); a variable
        the user set is kept."""
        if self._cache is None:  # a cluster's jobs: prepare sets no folder
            return {}
        return {var: str(self._cache / sub) for var, sub in caches.CACHES.items() if var not in os.environ}

    def _eval_env(self) -> dict[str, str]:
        return {**self.extra_env, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}

    def prepare(self, recipe, cache_dir: Path, run_dir: Path) -> int | None:
        """Once per study, outside every trial: the local Ray head (no ``ray_address``) and the evaluator's fork
        server start now, so no trial pays for them; the jobs' compile caches are this machine's (``caches.py``),
        else in ``cache_dir``."""
        if not self.ray_address:
            self._cache = caches.for_python(self.python, Path(cache_dir).resolve() / "openrlhf")
        self._per_gpu = round(1 / recipe.gpus_per_trial) if 0 < recipe.gpus_per_trial < 1 else 1
        if recipe.params.probe_splits():  # its imports overlap the head's start
            forked.server_for(
                sys.executable, forked.EVALUATE, {**os.environ, "PYTHONUNBUFFERED": "1", **self._eval_env()}
            )
        if recipe.params.warm_pool and not self.ray_address:
            gpus = len(packed_gpus(self._per_gpu) or []) or gpu_count()
            self._pools = warm.WarmPools(
                Path(cache_dir).resolve() / "warm",
                max(gpus // max(recipe.params.gpus_needed(), 1), 1),
                self._submit_pool,
                self._start_job,
            )
        if not self.ray_address:
            self.address(None)
        return None

    def start(self, plan: LaunchPlan):
        """Submit the plan as a Ray job, or hand it to a warm pool (``warm.py``); returns its handle at once."""
        if self._pools is not None:
            if plan.pool_key is not None:
                return self._pools.start(plan)
            self._pools.make_room(1, Path(plan.log_path).parent)  # GPUs that idle pools would hold for ever
            return self._pools.track_cold(self._start_job(plan))
        return self._start_job(plan)

    def _start_job(self, plan: LaunchPlan):
        """The plan as its own Ray job (``RayJobHandle``)."""
        reader = OpenRLHFMetricsReader.from_plan(plan)
        shipped, hook = cluster.shipped_with(self, plan.env)
        if self.ray_address:  # on a cluster: its reward wrapper sits in the run folder
            copy_wrapper(Path(plan.log_path).parent)
        return submit(
            self.address(plan),
            plan.argv,
            working_dir=plan.cwd,
            log_path=plan.log_path,
            env=plan.env,
            entrypoint_num_gpus=plan.resources.get("entrypoint_num_gpus", 0),
            reader=reader.poll,
            on_exit=reader.flush,
            py_modules=shipped,
            setup_hook=hook,
        )

    def _submit_pool(self, plan: LaunchPlan, pool: warm.Pool):
        """A warm pool's job (``warm_server.py``) with the runtime env of the trial it is made for."""
        _, hook = cluster.shipped_with(self, plan.env)
        argv = [self.python, "-m", warm.SERVER, str(pool.dir), "--owner-pid", str(os.getpid())]
        return submit(
            self.address(plan),
            argv,
            working_dir=plan.cwd,
            log_path=pool.dir / "pool.log",
            env=plan.env,
            entrypoint_num_gpus=plan.resources.get("entrypoint_num_gpus", 0),
            py_modules=[cluster.autorl_package()],
            setup_hook=hook,
        )

    def describe_job(self, spec: TrialSpec, plan: LaunchPlan) -> dict:
        """What the trial's job gets: its Python, entrypoint, runtime env, the files it reads, where it writes,
        where the eval runs and what the nodes must have (``cluster.view``)."""
        return cluster.view(self, spec, plan, trial_params(spec))

    def address(self, plan: LaunchPlan | None) -> str:
        """The plan's Ray address, or a local head started now (and stopped by ``close``)."""
        address = (plan.ray_address if plan is not None else None) or self.ray_address
        if address:
            return address
        return self._head.address(visible_gpus=packed_gpus(self._per_gpu))  # started again if it died

    def close(self) -> None:
        """Retire the warm pools; stop the local Ray head if this backend started one."""
        if self._pools is not None:
            self._pools.close()
        self._head.close()


def packed_gpus(per_gpu: int) -> list[str] | None:
    """The device list a local Ray head is given so that ``per_gpu`` trials share each GPU: every visible device
    named ``per_gpu`` times (Ray hands out logical GPUs by position in it, so two logical GPUs map to one card);
    None (Ray's own detection) for whole GPUs."""
    if per_gpu <= 1:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d for d in visible.split(",") if d.strip()] if visible is not None else [str(i) for i in range(gpu_count())]
    )
    return [d for d in devices for _ in range(per_gpu)]


def trial_params(spec: TrialSpec) -> OpenRLHFParams:
    """The trial's parameters: the seed override applied, the final model under the run dir by default."""
    params = spec.recipe.params
    update: dict[str, Any] = {"seed": spec.seed} if spec.seed is not None else {}
    if params.save_path is None:
        update["save_path"] = str(Path(spec.run_dir).resolve() / FINAL_MODEL)
    if params.save_hf_ckpt and params.ckpt_path is None:  # the job runs in an upload: a relative path is lost there
        update["ckpt_path"] = str(Path(spec.run_dir).resolve() / "ckpt")
    return params.model_copy(update=update)


def final_step(params: OpenRLHFParams) -> int:
    """The last global step (one per rollout batch in 0.10.x) when the prompt pool is capped, else 0."""
    return (params.max_samples // params.rollout_batch_size) * params.num_episodes if params.max_samples else 0


def wrap_reward(
    params: OpenRLHFParams, worktree: Path, wrapper: Path = REWARD_WRAPPER
) -> tuple[OpenRLHFParams, dict[str, str]]:
    """Route the builtin reward or a reward file through autorl's wrapper; URLs are left as they are."""
    spec = params.reward_func
    if spec is None or spec.startswith(("http://", "https://")):
        return params, {}
    inner = spec if spec == BUILTIN_REWARD else str((worktree / spec).resolve())
    env = {"AUTORL_REWARD": inner, "AUTORL_GROUP_SIZE": str(params.gens)}
    return params.model_copy(update={"reward_func": str(wrapper)}), env


def copy_wrapper(run_dir: Path) -> Path:
    """autorl's reward wrapper copied into the run folder, where a cluster's nodes read it (shared filesystem)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(REWARD_WRAPPER, run_dir / REWARD_WRAPPER.name))


def absolute_files(params: OpenRLHFParams, worktree: Path) -> OpenRLHFParams:
    """The model and prompt paths that name local files, made absolute: a job's working directory is an upload
    without weight files, so a relative model folder would reach it without its weights."""
    update = checks.local_files(params, worktree, ("pretrain", "prompt_data"))
    return params.model_copy(update=update) if update else params


def packed_env(gpus_per_trial: float, params: OpenRLHFParams) -> dict[str, str]:
    """A trial packed on a shared GPU: its vLLM engine's fixed KV-cache share (``vllm_share``; a user's own value
    in the backend's environment wins, 0 turns it off)."""
    if not 0 < gpus_per_trial < 1:
        return {}
    share = params.vllm_gpu_memory_utilization or checks.PACKED_MEMORY_MAX * gpus_per_trial
    return {ENV: fraction_for(share)}


def engine_env(params: OpenRLHFParams) -> dict[str, str]:
    """Environment the recipe's engine settings need: vLLM's engine core in its actor's own process."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if params.vllm_in_process else {}


def run_env(run_dir: Path) -> dict[str, str]:
    """The environment the metrics patches read: where the JSONL, samples and spike logs go."""
    metrics = run_dir / "metrics"
    return {
        "METRICS_LOG_DIR": str(metrics),
        "SAMPLES_LOG_DIR": str(run_dir / "samples"),
        "SPIKE_LOG_PATH": str(metrics / "spike_log.jsonl"),
        "PYTHONUNBUFFERED": "1",
    }


def eval_metric_map(params: OpenRLHFParams) -> dict[str, str]:
    """OpenRLHF eval keys -> autorl eval keys, per datasource and eval mode."""
    greedy = (params.eval_temperature or 0.0) == 0.0
    n = params.eval_n_samples_per_prompt or 1
    out = {}
    for source, split in params.eval_split_names.items():
        out[f"eval_{source}_pass1"] = f"eval/{split}/{'greedy' if greedy else 'sampling'}_pass@1"
        if n > 1:
            out[f"eval_{source}_pass{n}"] = f"eval/{split}/{'nondet_proxy' if greedy else 'sampling'}_pass@{n}"
    return out


# What sizes a warm pool's engines and placement (docs/warm-trials.md, 2.2): trials that differ only elsewhere share
# a pool. ``extra_args`` carries the engine switches (sleep, eager, prefix caching).
POOL_FIELDS = (
    "openrlhf_version",
    "pretrain",
    "vllm_num_engines",
    "vllm_tensor_parallel_size",
    "vllm_gpu_memory_utilization",
    "max_len",
    "colocate_all",
    "actor_num_nodes",
    "actor_num_gpus_per_node",
    "vllm_in_process",
    "extra_args",
)
WARM_VERSION = "0.10.4"


def pool_key(params: OpenRLHFParams, env: dict[str, str]) -> str:
    """The warm-pool key of a trial: a digest of its engine settings and the engine environment."""
    values = {name: getattr(params, name) for name in POOL_FIELDS}
    values["env"] = {name: env.get(name) for name in ("AUTORL_VLLM_KV_FRACTION", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warm_problem(params: OpenRLHFParams, on_cluster: bool) -> str | None:
    """Why ``warm_pool`` cannot run this recipe, as one line; None when it can or is off."""
    if not params.warm_pool:
        return None
    if on_cluster:
        return "train.warm_pool runs on autorl's local Ray head only: drop --ray-address or set warm_pool: false"
    if not params.colocate_all:
        return "train.warm_pool needs train.colocate_all: true (one placement group per pool); or set warm_pool: false"
    version = params.openrlhf_version or installed_version()
    if version is not None and version != WARM_VERSION:
        return f"train.warm_pool follows OpenRLHF {WARM_VERSION}'s train(), not {version}: set warm_pool: false"
    return None
