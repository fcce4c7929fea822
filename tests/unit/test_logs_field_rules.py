"""The field-log rules of issue 23 on the cases the field corpus holds no example of: what they
must NOT read as a failure, and how the engine is told by line shape alone."""

from __future__ import annotations

from kvgate.evidence.logs import scan_log
from kvgate.evidence.logs.shapes import engine_by_shape

# vLLM 0.7 V1: the same "EngineCore hit an exception" wraps a crash while serving (here an
# ngram-speculation crash after requests were served, vllm issue text): no start failure.
V1_RUNTIME_CRASH = """\
INFO 02-21 06:29:10 api_server.py:937] Starting vLLM API server on http://0.0.0.0:8080
ERROR 02-21 06:30:25 core.py:291] EngineCore hit an exception: Traceback (most recent call last):
ERROR 02-21 06:30:25 core.py:291]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 284, in run_engine_core
ERROR 02-21 06:30:25 core.py:291]     engine_core.run_busy_loop()
ERROR 02-21 06:30:25 core.py:291]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 327, in run_busy_loop
ERROR 02-21 06:30:25 core.py:291]     outputs = step_fn()
ERROR 02-21 06:30:25 core.py:291] IndexError: index 3 is out of bounds for dimension 0 with size 3
"""

# The same crash during construction: the frame shows the EngineCoreProc being built.
V1_START_CRASH = """\
ERROR 03-17 17:56:39 [core.py:340] EngineCore hit an exception: Traceback (most recent call last):
ERROR 03-17 17:56:39 [core.py:340]   File "/home/tms/vllm/vllm/v1/engine/core.py", line 332, in run_engine_core
ERROR 03-17 17:56:39 [core.py:340]     engine_core = EngineCoreProc(*args, **kwargs)
ERROR 03-17 17:56:39 [core.py:340]   File "/home/tms/vllm/vllm/v1/engine/core.py", line 287, in __init__
ERROR 03-17 17:56:39 [core.py:340]     super().__init__(vllm_config, executor_class, log_stats)
ERROR 03-17 17:56:39 [core.py:340] TypeError: Olmo2ForCausalLM.forward() got an unexpected keyword argument 'inputs_embeds'
"""

# SGLang serving-loop crash (no construction frame), and one through vLLM's package files that
# an SGLang 0.4 scheduler imports: neither is a start failure.
SGLANG_RUNTIME_CRASH = """\
[2025-03-01 10:00:00] The server is fired up and ready to roll!
[2025-03-01 10:05:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/scheduler.py", line 1999, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/scheduler.py", line 639, in event_loop_overlap
    self.process_batch_result(batch, result)
  File "/usr/local/lib/python3.10/dist-packages/vllm/v1/engine/core.py", line 71, in __init__
    raise RuntimeError("x")
RuntimeError: x
"""


def test_a_v1_crash_while_serving_is_no_start_failure() -> None:
    scan = scan_log(V1_RUNTIME_CRASH)
    assert scan.engine == "vllm"
    assert "engine-start-failed" not in scan.codes()
    assert not scan.failed


def test_a_v1_crash_while_building_the_engine_core_is_a_start_failure() -> None:
    scan = scan_log(V1_START_CRASH)
    failure = scan.finding("engine-start-failed")
    assert scan.engine == "vllm" and scan.failed
    assert failure is not None and failure.line == 3 and failure.count == 1
    assert "Root cause at line 6: TypeError" in failure.hint


def test_sglang_frames_of_the_serving_loop_or_of_vllm_files_are_no_start_failure() -> None:
    scan = scan_log(SGLANG_RUNTIME_CRASH)
    assert scan.engine == "sglang" and scan.ready
    assert "engine-start-failed" not in scan.codes()


def test_flashinfer_build_frames_without_their_summary_are_a_jit_failure_counted_once() -> None:
    frames = "".join(
        f'  File "/opt/venv/lib/python3.12/site-packages/flashinfer/jit/{where}", line 9, in {fn}\n'
        for where, fn in (("core.py", "build_and_load"), ("cpp_ext.py", "run_ninja"))
    )
    scan = scan_log(
        "INFO 10-27 20:11:24 [core.py:77] Initializing a V1 LLM engine (v0.11.0)\n" + frames
    )
    build = scan.finding("attention-build-failed")
    assert build is not None and build.line == 2 and build.count == 1
    assert "build_and_load" in build.text and scan.failed


def test_a_summary_line_keeps_its_finding_and_count_when_frames_follow() -> None:
    log = (
        "INFO 10-27 20:11:24 [core.py:77] Initializing a V1 LLM engine (v0.11.0)\n"
        "RuntimeError: Ninja build failed. Ninja output:\n"
        '  File "/x/flashinfer/jit/cpp_ext.py", line 200, in run_ninja\n'
        "subprocess.CalledProcessError: Command '['ninja', '-v', '-C', '/r/.cache/flashinfer/"
        "86/cached_ops', '-f', '/r/.cache/flashinfer/86/cached_ops/sampling/build.ninja']' "
        "returned non-zero exit status 1.\n"
    )
    build = scan_log(log).finding("attention-build-failed")
    assert build is not None and (build.line, build.count) == (2, 1)


def test_the_engine_is_told_by_line_shape_and_a_tie_tells_nothing() -> None:
    vllm_old = "INFO 02-02 18:01:24 model_runner.py:1116] Loading model weights took 30.7 GB\n"
    sglang = "[2025-10-16 09:06:09 TP7] Init torch distributed ends. mem usage=1.77 GB\n"
    assert engine_by_shape(vllm_old) == "vllm"
    assert engine_by_shape(sglang) == "sglang"
    assert engine_by_shape(vllm_old + sglang) is None
    assert engine_by_shape("nothing an engine prints\n") is None
    assert scan_log(vllm_old * 3).engine == "vllm"
    # a rule line still outvotes the shapes: FlashInfer/uvicorn lines are engine-neutral
    assert scan_log(sglang + "INFO:     Application startup complete.\n").engine == "sglang"


def test_vllm_args_namespace_gives_the_dtype_and_the_engine() -> None:
    line = (
        "INFO 09-06 14:48:07 api_server.py:460] args: Namespace(model='m', dtype='auto', "
        "kv_cache_dtype='fp8', quantization_param_path=None)\n"
    )
    scan = scan_log(line)
    assert (scan.engine, scan.kv_cache_dtype) == ("vllm", "fp8")
    assert scan.codes() == ["fp8-kv-enabled"]


def test_no_kv_memory_left_is_a_failure_even_when_the_paste_stops_there() -> None:
    log = (
        "(EngineCore pid=77) INFO 11-29 19:18:16 [core.py:104] Initializing a V1 LLM engine "
        "(v0.33.0) with config: model='Qwen/Qwen3-32B', kv_cache_dtype=auto\n"
        "(EngineCore pid=77) INFO 11-29 19:18:38 [gpu_worker.py:431] Available KV cache "
        "memory: -1.2 GiB\n"
    )
    scan = scan_log(log)
    found = scan.finding("insufficient-kv-memory")
    assert found is not None and found.line == 2 and scan.failed
    healthy = scan_log(log.replace("-1.2 GiB", "10.55 GiB"))
    assert not healthy.failed and healthy.capacity.kv_memory_gib == 10.55


def test_a_frame_wrapped_inside_its_path_is_joined_and_only_then() -> None:
    wrapped = (
        '  File "/venv/lib/python3.10/site-packages/vllm/engine/multi\n'
        '    processing/engine.py", line 138, in from_engine_args\n'
    )
    assert scan_log("INFO 02-02 18:01:24 model_runner.py:1116] x\n" + wrapped).failed
    # the same tail under a frame of another package is not vLLM's construction
    other = wrapped.replace("/vllm/engine/multi", "/mylib/engine/multi")
    scan = scan_log("INFO 02-02 18:01:24 model_runner.py:1116] x\n" + other)
    assert scan.engine == "vllm" and not scan.failed


def test_a_banner_cut_after_the_version_still_tells_it() -> None:
    # GIVEN the engine-init line of vLLM 0.24.0 as pasted in noonghunna/club-3090#612, cut
    # before `kv_cache_dtype=` WHEN scanned THEN the version before the cut is read (the rule is
    # anchored on its own needle, not on text later in the line).
    cut = (
        "(EngineCore pid=107) INFO 07-06 22:50:46 [core.py:114] Initializing a V1 LLM engine "
        "(v0.24.0) with config: mo\n"
    )
    scan = scan_log(cut)
    assert (scan.engine, scan.engine_version) == ("vllm", "0.24.0")
    # an unclosed version is not guessed at
    assert scan_log(cut.replace("(v0.24.0) with config: mo", "(v0.2")).engine_version is None


# vLLM's "To serve at least one request..." as pasted: rewrapped after the first clause under
# a quote bar (eugr/spark-vllm-docker#396) and wrapped mid-word by a terminal
# (SergiioB/intel-arc-pro-b70-inference-cookbook#4).
KV_TOO_SMALL_REWRAPPED = """\
▎ ValueError: To serve at least one request with the model's max seq len (196608),
▎ 23.25 GiB KV cache is needed, which is larger than the available KV cache memory (22.5 GiB).
"""
KV_TOO_SMALL_WRAPPED = """\
(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach
e is needed, which is larger than the available KV cache memory (4.25 GiB). Based on the avai
"""
KV_TOO_SMALL_WHOLE = (
    "(EngineCore_DP0 pid=1094) ValueError: To serve at least one request with the models's max "
    "seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache "
    "memory (3.18 GiB). Based on the available memory, the estimated maximum model length is "
    "34736. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine.\n"
)


def test_a_kv_too_small_error_cut_or_wrapped_is_still_a_failed_start() -> None:
    for text, max_len in ((KV_TOO_SMALL_REWRAPPED, "196608"), (KV_TOO_SMALL_WRAPPED, "100000")):
        scan = scan_log(text)
        finding = scan.finding("insufficient-kv-memory")
        assert scan.failed and finding is not None
        assert finding.hint.startswith(f"max_model_len {max_len} does not fit the KV cache: ")
    whole = scan_log(KV_TOO_SMALL_WHOLE).finding("insufficient-kv-memory")
    assert whole is not None
    assert whole.hint == (
        "max_model_len 262144 needs 24.0 GiB of KV cache but 3.18 GiB is free: set "
        "--max-model-len 34736 or less, or raise --gpu-memory-utilization."
    )


# vLLM with --kv-cache-memory-bytes skips profiling and prints its budget in one line
# (vllm/v1/worker/gpu_worker.py:467-479 in the 0.26.0 wheel), not "Available KV cache memory".
KV_BYTES_RESERVED = (
    "(Worker_TP{rank} pid=8{rank}) INFO 07-26 12:29:34 [gpu_worker.py:479] Initial free memory "
    "93.88 GiB, reserved {gib} GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does not respect the gpu_memory_utilization "
    "config.\n"
)


def test_a_kv_budget_given_in_bytes_is_the_kv_memory() -> None:
    # GIVEN two workers that each reserved their pinned budget WHEN scanned THEN the KV memory
    # is the smaller one, as for "Available KV cache memory" (the pool is sized by the smallest)
    log = KV_BYTES_RESERVED.format(rank=0, gib="49.0") + KV_BYTES_RESERVED.format(
        rank=1, gib="48.5"
    )
    scan = scan_log(log)
    assert (scan.engine, scan.capacity.kv_memory_gib, scan.failed) == ("vllm", 48.5, False)
    # a paste wrapped after "as specified by" (as quoted in bench write-ups) still reads
    wrapped = (
        "reserved 5.59 GiB memory for KV Cache as specified by\nkv_cache_memory_bytes config\n"
    )
    assert scan_log(wrapped).capacity.kv_memory_gib == 5.59


# SGLang raises this while sizing the pool in the scheduler's init, before any KV cache exists
# (sglang/srt/mem_cache/kv_cache_configurator.py:1802 in the 0.5.18 wheel; SGLang PR #28855).
SGLANG_WEIGHTS_FILL_BUDGET = (
    "[2026-07-09 10:11:12 TP0] ValueError: Loaded weights leave no GPU memory for the KV cache "
    "under --mem-fraction-static=0.88. Raise --mem-fraction-static above 0.912 (minimum viable = "
    "1 - available/pre = 0.9113). If using speculative decoding, draft weights are now counted.\n"
)


def test_sglang_weights_filling_the_static_budget_is_a_failed_start_with_its_fix() -> None:
    scan = scan_log(SGLANG_WEIGHTS_FILL_BUDGET)
    finding = scan.finding("insufficient-kv-memory")
    assert (scan.engine, scan.failed) == ("sglang", True)
    assert finding is not None and finding.line == 1
    assert finding.hint.startswith("Raise --mem-fraction-static above 0.912")
    # cut after the fraction (SemiAnalysisAI/InferenceX#2128), no header: still the same failure
    cut = scan_log(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.88.\n  Rai\n"
    )
    cut_finding = cut.finding("insufficient-kv-memory")
    assert (cut.engine, cut.failed) == ("sglang", True) and cut_finding is not None
    assert "0.88" in cut_finding.hint


def test_sglang_running_phase_sigquit_is_not_the_launch_phase_one() -> None:
    # SGLang >= 0.5.1x: the launch-phase handler says "Received sigquit from a child process"
    # (sglang/srt/entrypoints/engine.py:1728, 0.5.18); once serving, the tokenizer manager's
    # handler replaces it (tokenizer_manager.py:2192/3632), so its wording is no start failure.
    running = (
        "[2026-08-23 09:11:09] SIGQUIT received. signum=None, frame=None. It usually means one "
        "child failed.\n"
    )
    assert not scan_log(running).failed
    launch = "[2026-08-23 09:11:09] Received sigquit from a child process. It usually means the child failed.\n"
    assert scan_log(launch).failed
