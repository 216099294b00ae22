"""Where parallel trials run: local slots get their own CPUs and GPU, Ray-run backends are never pinned, and a
trial starts only while the GPUs it occupies are free."""

from __future__ import annotations

from pathlib import Path

from autorl.backends.base import LaunchPlan
from autorl.backends.openrlhf.backend import OpenRLHFBackend
from autorl.data import shipped
from autorl.recipe import load_recipe
from autorl.runs.slots import Slots


def _plan() -> LaunchPlan:
    return LaunchPlan(
        argv=["python", "-c", "pass"], env={"X": "1"}, cwd=".", log_path="/tmp/x.log", metrics_path="/tmp/x.jsonl"
    )


def test_a_local_slot_gets_its_cpus_and_gpu_but_a_ray_run_backend_is_never_pinned():
    recipe = load_recipe(shipped("recipes/default.yaml"))
    slots = Slots(2, None, gpus=2)
    local = slots.assign(_plan(), 1, recipe)
    assert local.env["CUDA_VISIBLE_DEVICES"] == "1" and local.cpus
    on_ray = slots.assign(_plan(), 1, recipe, on_ray=True)
    assert "CUDA_VISIBLE_DEVICES" not in on_ray.env and on_ray.cpus is None  # Ray gives the job's actors their GPUs


def test_trials_start_only_while_their_gpus_are_free():
    slots = Slots(4, None, gpus=2)
    assert slots.fits(1.0)
    slots.hold(0, 1.0)
    slots.hold(1, 1.0)
    assert not slots.fits(1.0)  # both GPUs busy: the third trial waits instead of a Ray job waiting or failing
    slots.release(0)
    assert slots.fits(1.0)
    packed = Slots(4, None, gpus=2)
    for slot in range(4):
        assert packed.fits(0.5)
        packed.hold(slot, 0.5)
    assert not packed.fits(0.5)  # gpus_per_trial 0.5: two trials per GPU, four on two


def test_a_trial_larger_than_the_host_runs_alone_and_a_cluster_places_its_own():
    slots = Slots(2, None, gpus=2)
    assert slots.fits(4.0)  # nothing runs: it starts (preflight says it does not fit)
    slots.hold(0, 4.0)
    assert not slots.fits(1.0)
    cluster = Slots(2, "http://127.0.0.1:8265", gpus=0)
    cluster.hold(0, 8.0)
    assert cluster.fits(8.0)
    assert Slots(2, None, gpus=0).fits(1.0)  # no GPU visible here: nothing to count


def test_an_openrlhf_trial_occupies_its_layouts_gpus_or_its_share_of_one():
    backend = OpenRLHFBackend()
    small = load_recipe(shipped("recipes/openrlhf-small.yaml"))
    assert backend.gpus_per_run(small) == 1.0  # actor and vLLM engine colocated on one GPU
    split = small.with_train(colocate_all=False)
    assert backend.gpus_per_run(split) == 2.0  # the actor on one, the engine on another (no reference: kl 0)
    assert backend.gpus_per_run(split.with_train(kl_coef=0.01)) == 3.0
    packed = small.model_copy(update={"gpus_per_trial": 0.5})
    assert backend.gpus_per_run(packed) == 0.5
    assert Path(shipped("recipes/openrlhf-small.yaml")).is_file()
