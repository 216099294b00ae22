"""Every error family in autorl/data/rules/crash_families.yaml, tested with a log built around one of
its real messages (the text as the library prints it, values filled in), and the precedence rules.

A family added to the rules needs a case here: test_every_family_has_a_case fails until it has one.
"""

from __future__ import annotations

import pytest

from autorl.judge.triage import classify, explain, load_rules
from autorl.states import CrashCategory

# family -> (a line as the library prints it, exit code). Sources are in crash_families.yaml.
CASES: dict[str, tuple[str, int | None]] = {
    "disk_full": ("OSError: [Errno 28] No space left on device: '/ckpt/global_step_40/optim.pt'", 1),
    "device_oom": (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB. GPU 1 has a total "
        "capacity of 63.98 GiB of which 201.00 MiB is free.",
        1,
    ),
    "nccl_device_oom": ("node7:2211:2290 [3] NCCL WARN Cuda failure 2 'out of memory'", 1),
    "shared_gpu_profiling": (
        "AssertionError: Error in memory profiling. Initial free memory 133.71 GiB, current free "
        "memory 135.95 GiB. This happens when other processes sharing the same container release "
        "GPU memory while vLLM is profiling during initialization.",
        1,
    ),
    "kv_cache_no_room_at_vllm_start": (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.",
        1,
    ),
    "card_occupied_at_vllm_start": (
        "ValueError: Free memory on device cuda:0 (3.67/139.8 GiB) on startup is less than "
        "desired GPU memory utilization (0.15, 20.97 GiB). Decrease GPU memory utilization "
        "or reduce GPU memory used by other processes.",
        1,
    ),
    "host_oom": (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough "
        "memory: you tried to allocate 8589934592 bytes.",
        1,
    ),
    "sigkill_no_error": ("train.sh: line 14: 90211 Killed                  python -m grpo.train", 137),
    "illegal_memory_access": ("RuntimeError: CUDA error: misaligned address", 1),
    "device_side_assert": ("RuntimeError: CUDA error: device-side assert triggered", 1),
    "kernel_assertion": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:94: operator(): block: [0,0,0], thread: [3,0,0] "
        "Assertion `input_val >= zero && input_val <= one` failed.",
        1,
    ),
    "index_assertion": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:94: operator(): block: [12,0,0], "
        'thread: [5,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
        'bounds"` failed.',
        1,
    ),
    "host_alloc_failed": ("terminate called after throwing an instance of 'std::bad_alloc'", -6),
    "segfault": ("Fatal Python error: Segmentation fault", -11),
    "sigkill_direct": ("    exitcode  : -9 (pid: 161617)", 1),
    "missing_key_in_library": ("KeyError: 'reward_model'", 1),  # raised in CONTEXT's site-packages frame
    "node_memory_eviction": ("Message: The node was low on resource: memory. Container trainer was using 61Gi.", 1),
    "gpu_busy": ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", 1),
    "anomaly_backward": (
        "[W python_anomaly_mode.cpp:104] Warning: Error detected in SoftmaxBackward0. Traceback of forward call "
        "that caused the error:",
        1,
    ),
    "loss_scale_collapse": (
        "[2023-06-07 22:16:00,018] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
        "step. Attempted loss scale: 64, reducing to 32",
        1,
    ),
    "engine_stall": (
        "TimeoutError: RPC call to execute_model timed out.",
        1,
    ),
    "engine_core_timeout": ("(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] TimeoutError", 1),
    "library_attribute_missing": ("AttributeError: 'LLMEngine' object has no attribute 'model_executor'", 1),
    "launcher_summary": (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 1622990) of "
        "binary: /usr/bin/python",
        1,
    ),
    "scheduler_time_limit": (
        "slurmstepd: error: *** JOB 771 ON gpu03 CANCELLED AT 2025-02-01T08:00:00 DUE TO TIME LIMIT ***",
        None,
    ),
    "nonfinite_refused": ("RuntimeError: NaNs detected in logits: ['req-17', 'req-18']", 1),
    "nonfinite_metric": ("{'loss': 0.0131, 'grad_norm': inf, 'learning_rate': 1e-06, 'reward': 0.41, 'epoch': 0.2}", 0),
    "network": ("httpx.ConnectTimeout: timed out", 1),
    "hub_unreachable": (
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
        "find them in the cached files.",
        1,
    ),
    "port_in_use": (
        "RuntimeError: The server socket has failed to listen on any local network address. "
        "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        1,
    ),
    "backend_incompat": (
        "ImportError: This modeling file requires the following packages that were not found "
        "in your environment: flash_attn. Run `pip install flash_attn`",
        1,
    ),
    "abi_mismatch": (
        "ImportError: /venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-"
        "gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
        1,
    ),
    "config_error": (
        "ValueError: GRPO requires at least 2 generations per prompt to calculate the advantages. "
        "You provided 1, which is less than the minimum required.",
        1,
    ),
    "checkpoint_missing": ("error: no checkpoint at /runs/attempt-03/model", 1),
    "reward_function_error": ("Failed to fetch reward from remote RM: [Errno 2] No such file", 1),
    "reward_signature": ("TypeError: format_reward() missing 1 required positional argument: 'solution'", 1),
    "rewards_missing": ("ValueError: reward_model_group is required when rewards are not precomputed", 1),
    "python_bug": ("ZeroDivisionError: division by zero", 1),
    "collective_timeout": (
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
        "Timed out waiting 600000ms for send operation to complete",
        1,
    ),
    "nccl_error": (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "remote process exited or there was a network error, NCCL version 2.21.5",
        1,
    ),
    "nccl_setup_error": (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "NCCLUtils.cpp:77, unhandled system error, NCCL version 2.26.2",
        1,
    ),
    "module_missing": ("ModuleNotFoundError: No module named 'math_verify'", 1),
    "inplace_modified": (
        "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
        "operation: [torch.cuda.FloatTensor [8, 512]], which is output 0 of SoftmaxBackward0, is at version 1; "
        "expected version 0 instead.",
        1,
    ),
    "nccl_net_error": (
        "node2:811:902 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
        "10.1.0.4<51812> with status=12 opcode=1 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.0.3",
        1,
    ),
    "killed_by_signal": ("KeyboardInterrupt", -2),
    "scheduler_cancel": ("slurmstepd: error: *** JOB 771 ON gpu03 CANCELLED AT 2025-02-01T08:00:00 ***", None),
    "scheduler_preempt": (
        "slurmstepd: error: *** STEP 771.0 ON gpu03 CANCELLED AT 2025-02-01T08:00:00 DUE TO PREEMPTION ***",
        None,
    ),
    "signal_received": (
        "W0201 08:00:00.120000 811 torch/distributed/elastic/agent/server/api.py:719] Received 15 "
        "death signal, shutting down workers",
        -15,
    ),
    "ray_head_lost": (
        "autorl: the Ray head at http://127.0.0.1:8265 stopped answering for 31 s (ConnectionError: "
        "HTTPConnectionPool(host='127.0.0.1', port=8265): Max retries exceeded with url: /api/jobs/x "
        "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection "
        "refused'))): job autorl-1 is lost",
        1,
    ),
    "ray_worker_died": ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", 1),
    "checkpoint_file_unopenable": ("RuntimeError: File /ckpt/global_step_40/model.pt cannot be opened.", 1),
    "srun_task_killed": ("srun: error: gpu03: task 0: Killed", None),
    "collective_timeout_summary": (
        "[rank14]:[E ProcessGroupNCCL.cpp:1537] [PG 1 Rank 14] Timeout at NCCL work: 15734, last enqueued NCCL work: "
        "15735, last completed NCCL work: 15733.",
        1,
    ),
    "store_wait_timeout": (
        "[rank0]:[W710 16:53:50.544805244 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=111, "
        "addr=[localhost]:42404, remote=[::ffff:0.0.0.0]:51216) timed out after 300000ms",
        1,
    ),
    "tracker_unreachable": ("wandb: Network error (ReadTimeout), entering retry loop.", 1),
    "trl_server_endpoint_missing": ('Exception: Request failed: 404, {"detail":"Not Found"}', 1),
    "cuda_debugger_exception": (
        'Thread 137 "pt_autograd_0" received signal CUDA_EXCEPTION_14, Warp Illegal Address.',
        None,
    ),
    # raised in the run's own tree (FRAMES below): /srv/proj/verl/... names its own module verl.utils...
    "own_module_attribute_missing": (
        "AttributeError: module 'verl.utils.reward_score.qwen_math' has no attribute 'compute_score_r1'",
        1,
    ),
}

CONTEXT = [
    "2025-02-01 07:59:40,101 INFO trainer: step 11 | reward 0.412 | kl 0.0031",
    "2025-02-01 07:59:52,877 INFO trainer: step 12 | reward 0.437 | kl 0.0034",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/engine/step.py", line 88, in run',
    "    out = self._step(batch)",
]


# a line that names the engine, for a family that holds only in one engine's logs
ENGINE_LINES = {
    "trl": "INFO trl.trainer.grpo_trainer: GRPOTrainer with use_vllm=True, vllm_mode=server",
    "openrlhf": "Running entrypoint for job autorl-1: python3 -m openrlhf.cli.train_ppo_ray",
    "vllm": "INFO 02-03 22:40:01 [llm_engine.py:88] Initializing a V1 LLM engine (vllm/engine) with config: ...",
}


# the traceback frame just above a family's line where CONTEXT's (an installed library's) does not fit it
FRAMES = {
    "own_module_attribute_missing": '  File "/srv/proj/verl/trainer/main_ppo.py", line 76, in <module>',
}


def _family(family_id: str):
    return next(f for f in load_rules().families if f.id == family_id)


def test_every_family_has_a_case():
    assert {f.id for f in load_rules().families} == set(CASES)


def test_every_message_names_its_source():
    for family in load_rules().families:
        for message in family.messages:
            assert message.lib and message.ver and message.at, (family.id, message.re)


@pytest.mark.parametrize("family_id", sorted(CASES))
def test_family_matches_its_real_message(family_id):
    line, code = CASES[family_id]
    engine = [ENGINE_LINES[e] for e in _family(family_id).engines[:1]]
    context = [*CONTEXT, FRAMES[family_id]] if family_id in FRAMES else CONTEXT
    log = "\n".join([*engine, *context, line, "[launcher] child exited"]) + "\n"
    d = classify(log, exit_code=code)
    family = _family(family_id)
    sure = family.confidence >= load_rules().min_confidence  # below it the call is unknown, the family its candidate
    assert d.category == (family.category if sure else CrashCategory.UNKNOWN), (family_id, d)
    assert sure or d.candidates[0].family == family_id, (family_id, d.candidates)
    assert d.root_cause_line == line
    fired = [t for t in explain(log, exit_code=code) if t.startswith("family ")]
    assert fired and fired[0].startswith(f"family {family_id} ") and "by a message from " in fired[0]


# ---- precedence ------------------------------------------------------------------------------

ECHO = (
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5"
)


def test_a_ranks_own_error_beats_the_collectives_echo_printed_before_it():
    own = "[rank2]: ZeroDivisionError: division by zero"
    d = classify("\n".join([ECHO, own]) + "\n", exit_code=1)
    assert (d.category, d.root_cause_line) == (CrashCategory.USER_CODE_ERROR, own)
    assert any("only echoes another process's failure" in t for t in explain("\n".join([ECHO, own]), exit_code=1))


def test_a_ranks_own_unknown_exception_beats_the_echo():
    """An exception no family knows, raised in the rank's own code, is still that rank's error."""
    log = "\n".join(
        [
            ECHO,
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "/home/me/grpo/buffer.py", line 41, in push',
            "[rank1]:     raise RuntimeError(f'buffer holds {n} groups, expected {m}')",
            "[rank1]: RuntimeError: buffer holds 7 groups, expected 8",
        ]
    )
    d = classify(log, exit_code=1)
    assert (d.category, d.root_cause_line) == (
        CrashCategory.USER_CODE_ERROR,
        "[rank1]: RuntimeError: buffer holds 7 groups, expected 8",
    )


def test_the_echo_alone_is_a_distributed_failure():
    assert classify(ECHO + "\n", exit_code=1).category == CrashCategory.DISTRIBUTED_TIMEOUT


def test_a_chain_of_exceptions_is_reported_at_its_first():
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/opt/venv/lib/python3.11/site-packages/engine/sync.py", line 9, in pull',
            "engine.sync.StaleVersionError: weights at version 41, expected 42",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "Traceback (most recent call last):",
            '  File "/opt/venv/lib/python3.11/site-packages/engine/loop.py", line 30, in step',
            "RuntimeError: step 42 failed",
        ]
    )
    d = classify(log, exit_code=1)
    assert d.root_cause_line == "engine.sync.StaleVersionError: weights at version 41, expected 42"


def test_a_line_that_points_at_the_root_cause_above_is_a_wrapper():
    cause = "(EngineCore_DP0 pid=5) ValueError: Total number of attention heads (14) must be divisible by tensor parallel size (4)."
    log = "\n".join(
        [cause, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    )
    d = classify(log, exit_code=1)
    assert (d.category, d.root_cause_line) == (CrashCategory.CONFIG_ERROR, cause)


def test_an_unknown_error_raised_where_a_library_validates_settings_is_a_config_error():
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/opt/venv/lib/python3.11/site-packages/trl/trainer/grpo_config.py", line 1160, in __post_init__',
            "    raise ValueError(",
            "ValueError: vllm_importance_sampling_clip_min (2.0) must be less than vllm_importance_sampling_clip_max (1.5).",
        ]
    )
    d = classify(log, exit_code=1)
    assert d.category == CrashCategory.CONFIG_ERROR and d.root_cause_line.startswith("ValueError: vllm_importance")
    elsewhere = log.replace("trl/trainer/grpo_config.py", "trl/trainer/grpo_trainer.py")
    assert classify(elsewhere, exit_code=1).category == CrashCategory.UNKNOWN


def test_a_nan_metric_line_is_nan_even_with_exit_zero_but_a_tensorboard_warning_is_not():
    line = "(TaskRunner pid=8) step:14 - actor/pg_loss:nan - actor/grad_norm:nan - critic/score/mean:0.000"
    d = classify(f"step:13 - actor/grad_norm:0.31\n{line}\ndone\n", exit_code=0)
    assert (d.category, d.root_cause_line) == (CrashCategory.NAN_DIVERGENCE, line)
    assert (
        classify("WARNING:tensorboardX.x2num:NaN or Inf found in input tensor.\n", exit_code=0).category
        == CrashCategory.UNKNOWN
    )
    assert classify("{'loss': 0.0, 'grad_norm': 0.21, 'nan_count': 0}\n", exit_code=0).category == CrashCategory.UNKNOWN


def test_the_c10_log_stamp_measures_a_silence():
    """torch's C++ log stamp ([W412 05:04:10.1 ...]: month 4, day 12) counts as a timestamp."""
    log = (
        "[2025-04-12 05:01:52,004] INFO trainer: step 2\n"
        "[rank0]:[W412 05:04:10.118000 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0] barrier\n"
        "W0412 07:10:02.530000 4410 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
        "shutting down workers\n"
    )
    assert classify(log, exit_code=-15).category == CrashCategory.HANG_TIMEOUT
    assert classify(log.replace("W0412 07:10", "W0412 05:05"), exit_code=-15).category == CrashCategory.KILLED_EXTERNAL


def test_an_exception_behind_vllms_logger_prefix_is_still_an_exception():
    """vLLM and OpenRLHF log tracebacks as 'ERROR 03-14 09:31:29 [core.py:708] ...': the frame and the
    exception behind that prefix are read like bare ones (a library's settings check: config_error)."""
    pre = "(EngineCore_DP0 pid=51) ERROR 03-14 09:31:29 [core.py:708] "
    line = pre + "ValueError: num_speculative_tokens (0) must be positive."
    log = "\n".join(
        [
            pre + "Traceback (most recent call last):",
            pre
            + '  File "/usr/local/lib/python3.12/dist-packages/vllm/config/speculative.py", line 310, in __post_init__',
            pre + "    raise ValueError(",
            line,
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )
    d = classify(log, exit_code=1)
    assert (d.category, d.root_cause_line) == (CrashCategory.CONFIG_ERROR, line)
