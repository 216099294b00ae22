"""A warm pool's server: one Ray job that runs a study's OpenRLHF 0.10.4 trials one after another, keeping the
driver, Ray connection, imports, placement group and vLLM engines alive between them (docs/warm-trials.md).

The controller side (``warm.py``) submits this module as the pool's Ray job and hands it trials as files:

- ``POOL/inbox/<attempt>.json``: ``{"attempt", "argv", "env", "run_dir", "index"}``; ``argv`` is the trial's full
  ``train_ppo_ray`` argv from ``build_argv`` (its first three words, ``python -m openrlhf.cli.train_ppo_ray``, are
  skipped);
- ``POOL/stop/<attempt>``: stop that trial (its actors are killed, then the pool is checked);
- ``POOL/retire``: end the job after the trial in hand.

For each trial the server prints ``AUTORL-WARM <attempt> begin|vllm|actor|fit|end`` (``phases.py`` cuts a trial's
slice of the job log at them) and writes ``POOL/done/<attempt>.json``: ``{"code", "reason", "index", "seconds"}``.

What a trial gets, in order:

1. its argv through 0.10.4's own ``__main__`` block (parser, ``hierarchize``, every check), ``train`` captured;
2. the pool's key (``engine_key``: what sizes the engines and placement): on the pool's first trial the engines
   are built from it, as ``train`` builds them; a later trial with another key is refused (``REFUSED``) and the
   controller runs it cold;
3. on a later trial the engines are reset: woken, their weights reloaded from the base checkpoint (vLLM's
   ``reload_weights``), the prefix cache reset, each worker reseeded with ``seed + i`` as a fresh engine is, the
   trial's reward environment set and a new agent executor made (a fresh reward module: no GRPO group of the last
   trial survives), the weights' digest checked against the pool's first load, then put back to sleep;
4. a fresh actor group (and reference group when ``kl_coef > 0``) and a fresh ``PPOTrainer``, each with the
   trial's environment (``runtime_env`` env_vars): new processes, new DeepSpeed engines, optimizer and scheduler
   (option A of the design);
5. ``fit``, the save, then the trial's actors are killed.

A trial that fails, is stopped, or leaves an engine with unfinished requests or other weights retires the pool:
the job ends after writing its done file, and the next trial gets a fresh pool. Only colocated layouts
(``colocate_all``) run warm in this version: their placement group is the pool's own.

Runs inside the Ray job only (imports ray, torch, vLLM and openrlhf there). ``engine_key`` and ``parse_words`` take
plain values so the controller's tests read them without a GPU.

    python -m autorl.backends.openrlhf.warm_server POOL_DIR [--owner-pid PID]
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REFUSED = 75  # the trial's key differs from the pool's: the controller runs it as a cold job
STOPPED = -15  # a trial stopped by the controller (as a job stopped by Ray reads)
POLL_S = 0.2
# sha256 of the source of OpenRLHF 0.10.4's ``train`` in cli/train_ppo_ray.py: ``run_trial`` follows that body, so
# another body (another release, a patch to it) is refused and trials run cold (tests check the wheel's digest)
TRAIN_DIGEST = "d16a785127145369926704585ed420b562fabb54e0c306c9cd68bad356c18703"
ENGINE_ARGS = (
    "actor.model_name_or_path",
    "vllm.num_engines",
    "vllm.tensor_parallel_size",
    "data.max_len",
    "vllm.gpu_memory_utilization",
    "vllm.enable_prefix_caching",
    "vllm.enforce_eager",
    "vllm.enable_sleep",
    "train.full_determinism_enable",
    "train.colocate_all",
    "train.async_enable",
    "train.agent_func_path",
    "actor.num_nodes",
    "actor.num_gpus_per_node",
    "algo.advantage.is_correction_enable",
)
ENGINE_ENV = ("AUTORL_VLLM_KV_FRACTION", "VLLM_ENABLE_V1_MULTIPROCESSING")


def dotted(args: Any, name: str) -> Any:
    """``args.a.b`` for ``"a.b"`` (None where 0.10.4's namespace lacks it)."""
    value = args
    for part in name.split("."):
        value = getattr(value, part, None)
    return value


def engine_key(args: Any, env: dict[str, str]) -> dict[str, Any]:
    """What the pool's engines and placement were built from: a trial may run warm only where it is the same."""
    key = {name: dotted(args, name) for name in ENGINE_ARGS}
    key.update({name: env.get(name) for name in ENGINE_ENV})
    return key


def train_digest(source: str) -> str:
    """sha256 of the source text of the function ``train`` in ``source`` (cli/train_ppo_ray.py), the same under
    every Python (``ast.dump`` is not)."""
    tree = ast.parse(source)
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    return hashlib.sha256((ast.get_source_segment(source, train) or "").encode()).hexdigest()


def parse_words(source: str, filename: str, words: list[str], namespace: dict[str, Any]) -> Any:
    """The args 0.10.4's ``__main__`` block of ``source`` builds from ``words`` (its parser, ``hierarchize`` and
    checks), with ``train(args)`` captured instead of run. ``namespace``: the module's globals."""
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    if ast.unparse(main.body[-1]) != "train(args)":
        raise RuntimeError(f"{filename}: its __main__ block does not end in train(args)")
    captured: list[Any] = []
    saved = sys.argv
    sys.argv = ["train_ppo_ray.py", *words]
    try:
        exec(  # the installed OpenRLHF's own parser, as ``python -m`` would run it
            compile(ast.Module(body=main.body, type_ignores=[]), filename, "exec"),
            {**namespace, "train": captured.append},
        )
    finally:
        sys.argv = saved
    return captured[0]


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (the controller polls for it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True))
    os.replace(tmp, path)


def mark(attempt: str, phase: str, detail: str = "") -> None:
    print(f"AUTORL-WARM {attempt} {phase}{' ' + detail if detail else ''}", flush=True)


class EnvActor:
    """An actor class whose ``.options`` adds the trial's environment (for ``RayActorGroup``)."""

    def __init__(self, cls: Any, env: dict[str, str]):
        self.cls, self.env = cls, env

    def options(self, **kwargs: Any) -> Any:
        return self.cls.options(runtime_env={"env_vars": self.env}, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("cls", "env") or name.startswith("__"):  # unpickling looks for these before they are set
            raise AttributeError(name)
        return getattr(self.cls, name)


class Server:
    """The pool: its engines, placement group and key, and the loop that runs trials."""

    def __init__(self, pool: Path, owner_pid: int | None):
        self.pool, self.owner_pid = pool, owner_pid
        for sub in ("inbox", "done", "stop"):
            (pool / sub).mkdir(parents=True, exist_ok=True)
        self.key: dict[str, Any] | None = None
        self.engines: list[Any] = []
        self.pg: Any = None
        self.base_digest: list[str] | None = None

    # ---- the loop ----------------------------------------------------------------------------------------------
    def serve(self) -> int:
        import ray  # in the job only
        from openrlhf.cli import train_ppo_ray  # in the job only

        self.module = train_ppo_ray
        self.source = Path(train_ppo_ray.__file__).read_text()
        if not ray.is_initialized():
            ray.init()  # the job's own runtime env applies, as train()'s ray.init would get
        while True:
            if (self.pool / "retire").exists() or not self._owner_alive():
                return 0
            request = self._next()
            if request is None:
                time.sleep(POLL_S)
                continue
            code, reason, seconds = self.run(request)
            write_json(
                self.pool / "done" / f"{request['attempt']}.json",
                {"code": code, "reason": reason, "index": request.get("index", 0), "seconds": seconds},
            )
            mark(request["attempt"], "end", f"code={code}")
            if code not in (0, REFUSED):
                return 0  # retired: no pool is reused after a failure

    def _owner_alive(self) -> bool:
        if self.owner_pid is None:
            return True
        try:
            os.kill(self.owner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _next(self) -> dict[str, Any] | None:
        for path in sorted((self.pool / "inbox").glob("*.json")):
            try:
                request = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            path.unlink(missing_ok=True)
            return request
        return None

    # ---- one trial ---------------------------------------------------------------------------------------------
    def run(self, request: dict[str, Any]) -> tuple[int, str, dict[str, float]]:
        attempt = request["attempt"]
        seconds: dict[str, float] = {}
        mark(attempt, "begin", f"index={request.get('index', 0)}")
        try:
            if train_digest(self.source) != TRAIN_DIGEST:
                return REFUSED, "the installed OpenRLHF's train() is not 0.10.4's", seconds
            env = {str(k): str(v) for k, v in request["env"].items()}
            os.environ.update(env)
            args = parse_words(self.source, self.module.__file__, list(request["argv"][3:]), vars(self.module))
            key = engine_key(args, env)
            if not args.train.colocate_all or args.train.async_enable:
                return REFUSED, "only synchronous colocate_all layouts run warm", seconds
            if self.key is not None and key != self.key:
                return REFUSED, "another engine key", seconds
            t = time.time()
            mark(attempt, "vllm")
            if self.key is None:
                self._build(args)
                self.key = key
                self._reset(args, env, reload=False)
            else:
                self._reset(args, env, reload=True)
            seconds["vllm"] = round(time.time() - t, 2)
            return self._train(attempt, args, env, seconds)
        except Exception:
            traceback.print_exc()
            sys.stdout.flush()
            return 1, "exception", seconds

    def _build(self, args: Any) -> None:
        """The placement group and engines, as 0.10.4's ``train`` builds them, from autorl's engine class."""
        import ray  # in the job only
        from openrlhf.trainer.ray import vllm_engine  # in the job only
        from ray.util.placement_group import placement_group  # in the job only

        bundles = [{"GPU": 1, "CPU": 1} for _ in range(args.actor.num_nodes * args.actor.num_gpus_per_node)]
        self.pg = placement_group(bundles, strategy="PACK")
        ray.get(self.pg.ready())
        vllm_engine.RolloutRayActor = warm_engine_class()  # create_vllm_engines reads the module's name
        self.engines = vllm_engine.create_vllm_engines(
            args.vllm.num_engines,
            args.vllm.tensor_parallel_size,
            args.actor.model_name_or_path,
            args.train.seed,
            args.train.full_determinism_enable,
            args.vllm.enable_prefix_caching,
            args.vllm.enforce_eager,
            args.data.max_len,
            self.pg if not args.train.async_enable else None,
            args.vllm.gpu_memory_utilization,
            args.vllm.enable_sleep,
            "processed_logprobs" if args.algo.advantage.is_correction_enable else None,
            agent_func_path=args.train.agent_func_path,
            remote_rm_url=args.reward.remote_url,
            max_images_per_prompt=getattr(args.data, "max_images_per_prompt", 0),
        )

    def _reset(self, args: Any, env: dict[str, str], reload: bool) -> None:
        """Every engine as a fresh one would meet the trial (see the module's docstring, step 3)."""
        import ray  # in the job only

        reward_env = {k: v for k, v in env.items() if k.startswith("AUTORL_")}
        found = ray.get(
            [
                engine.autorl_reset.remote(
                    args.train.seed + i,
                    reward_env,
                    args.reward.remote_url,
                    args.train.agent_func_path,
                    reload,
                    bool(args.vllm.enable_sleep),
                )
                for i, engine in enumerate(self.engines)
            ]
        )
        for i, state in enumerate(found):
            print(f"autorl warm: engine {i} {json.dumps(state, sort_keys=True)}", flush=True)
            if state["unfinished"]:
                raise RuntimeError(f"engine {i} still holds {state['unfinished']} requests")
        digests = [state["digest"] for state in found]
        if self.base_digest is None:
            self.base_digest = digests
        elif digests != self.base_digest:
            raise RuntimeError("an engine's reloaded weights differ from the pool's first load")

    def _train(
        self, attempt: str, args: Any, env: dict[str, str], seconds: dict[str, float]
    ) -> tuple[int, str, dict[str, float]]:
        """Fresh actors and trainer for the trial (the rest of 0.10.4's ``train``), fit, save, kill."""
        import ray  # in the job only

        t = time.time()
        mark(attempt, "actor")
        strategy, actor_model, ref_model, trainer = self._actors(args, env)
        groups = [g for g in (actor_model, ref_model) if g is not None]
        try:
            max_steps = ray.get(trainer.get_max_steps.remote())
            refs = actor_model.async_init_model_from_pretrained(
                strategy, args.actor.model_name_or_path, max_steps, self.engines
            )
            if ref_model is not None:
                refs.extend(ref_model.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path))
            ray.get(refs)
            seconds["actor"] = round(time.time() - t, 2)
            t = time.time()
            mark(attempt, "fit")
            if not self._wait(attempt, trainer.fit.remote()):
                return STOPPED, "stopped", seconds
            seconds["fit"] = round(time.time() - t, 2)
            t = time.time()
            ray.get(actor_model.async_save_model())
            seconds["save"] = round(time.time() - t, 2)
            return 0, "ok", seconds
        finally:
            for handle in [trainer, *(h for g in groups for h in g._actor_handlers)]:
                ray.kill(handle, no_restart=True)

    def _actors(self, args: Any, env: dict[str, str]) -> tuple[Any, Any, Any, Any]:
        """The trial's strategy, actor group, reference group (or None) and ``PPOTrainer``: new processes with the
        trial's environment, as 0.10.4's ``train`` makes them on a colocated layout."""
        from openrlhf.trainer.ppo_trainer import PPOTrainer  # in the job only
        from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor  # in the job only
        from openrlhf.trainer.ray.ppo_actor import PolicyModelActor  # in the job only
        from openrlhf.utils import get_strategy  # in the job only

        strategy = get_strategy(args)
        strategy.print(args)
        duplicates = args.ds.ring_attn_size * args.ds.tensor_parallel_size

        def group(role: Any, cls: Any) -> Any:
            made = RayActorGroup(
                role.num_nodes,
                role.num_gpus_per_node,
                EnvActor(cls, env),
                pg=self.pg,
                num_gpus_per_actor=0.2,
                duplicate_actors=duplicates,
            )
            made.ray_actor_type = cls  # the group travels to the trainer: the plain class, not the wrapper
            return made

        actor_model = group(args.actor, PolicyModelActor)
        ref_model = group(args.ref, ReferenceModelActor) if args.algo.kl.init_coef > 0 else None
        trainer = PPOTrainer.options(runtime_env={"env_vars": env}).remote(
            args.actor.model_name_or_path,
            strategy,
            actor_model,
            None,
            None,
            ref_model,
            self.engines,
            do_sample=True,
            max_len=args.data.max_len,
            max_new_tokens=args.rollout.max_new_tokens,
            temperature=args.rollout.temperature,
            top_p=args.rollout.top_p,
        )
        return strategy, actor_model, ref_model, trainer

    def _wait(self, attempt: str, ref: Any) -> bool:
        """Wait for ``fit``; False as soon as the controller asks to stop the trial."""
        import ray  # in the job only

        stop = self.pool / "stop" / attempt
        while True:
            ready, _ = ray.wait([ref], timeout=1.0)
            if ready:
                ray.get(ref)  # raises the trial's error
                return True
            if stop.exists():
                return False


def warm_engine_class() -> Any:
    """0.10.4's ``RolloutRayActor`` with the reset a warm trial needs, as a Ray actor class of its own (Ray
    refuses a subclass of a decorated class: the subclass derives from the class it decorated)."""
    import asyncio  # in the job only

    import ray  # in the job only
    from openrlhf.trainer.ray import vllm_engine  # in the job only
    from openrlhf.utils.agent import SingleTurnAgentExecutor  # in the job only

    base = vllm_engine.RolloutRayActor
    base = getattr(getattr(base, "__ray_metadata__", None), "modified_class", base)

    class WarmRollout(base):  # type: ignore[misc, valid-type]
        async def __init__(self, *args: Any, **kwargs: Any):  # type: ignore[misc]  # Ray awaits an async actor init
            kwargs["worker_extension_cls"] = "autorl.backends.openrlhf.warm_worker.WarmWorker"
            await super().__init__(*args, **kwargs)

        async def autorl_reset(
            self, seed: int, env: dict[str, str], remote_rm_url: Any, agent_func_path: Any, reload: bool, sleep: bool
        ) -> dict[str, Any]:
            os.environ.update(env)
            if await self.llm.is_sleeping():
                for tag in ("weights", "kv_cache"):
                    await self.llm.wake_up(tags=[tag])
            if reload:
                await self.llm.collective_rpc("reload_weights")
            cache_reset = await self.llm.reset_prefix_cache()
            await self.llm.collective_rpc("autorl_reseed", args=(seed,))
            digest = await self.llm.collective_rpc("autorl_digest")
            if agent_func_path:
                self.executor = vllm_engine._load_agent_executor(agent_func_path)
            else:
                self.executor = SingleTurnAgentExecutor(remote_rm_url)
            unfinished = self.llm.output_processor.get_num_unfinished_requests()
            if sleep:
                await self.llm.sleep(level=1)
            await asyncio.sleep(0)
            return {"digest": digest, "unfinished": unfinished, "cache_reset": cache_reset, "seed": seed}

    return ray.remote(WarmRollout)


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words:
        print("usage: python -m autorl.backends.openrlhf.warm_server POOL_DIR [--owner-pid PID]", file=sys.stderr)
        return 2
    owner = int(words[words.index("--owner-pid") + 1]) if "--owner-pid" in words else None
    return Server(Path(words[0]), owner).serve()


if __name__ == "__main__":
    sys.exit(main())
