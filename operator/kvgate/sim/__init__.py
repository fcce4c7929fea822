"""kvgate.sim: an emulator of vLLM's and SGLang's observable surface, for tests and the demo.

Command lines (as the engines take them):

    python -m kvgate.sim vllm serve MODEL [vLLM flags]
    python -m kvgate.sim vllm.entrypoints.openai.api_server --model MODEL [vLLM flags]
    python -m kvgate.sim sglang --model-path MODEL [SGLang flags]     (alias: sglang.launch_server)

It prints the startup log of the emulated engine version for the GPU and checkpoint in the
environment, fails where that engine fails (FlashInfer JIT on an L4 with FP8 KV, a KV pool
too small for max-model-len, argparse errors, injected faults), then serves `/health`,
`/v1/models`, `/v1/completions`, `/v1/chat/completions` (SSE with `stream`), `/metrics`
(vLLM always, SGLang with `--enable-metrics`; with each finished request's prompt and
generated tokens in the engine's request-length histograms, SGLang before 0.5.11 only with
`--collect-tokens-histogram`), vLLM's `/version` `/ping` `/load` and
SGLang's `/health_generate` `/get_server_info` `/server_info` `/get_model_info`.
SIGTERM: the engine's shutdown lines, exit 0.

Environment (docs/contracts.md): POD_IP, KVGATE_SIM_GPU, KVGATE_SIM_GPU_MEMORY_GIB,
KVGATE_SIM_ENGINE_VERSION, KVGATE_SIM_MODEL_PROFILE, KVGATE_SIM_KV_SCALES,
KVGATE_SIM_CHECKPOINT_QUANT,
KVGATE_SIM_STARTUP_DELAY, KVGATE_SIM_FAULTS, KVGATE_SIM_ACCURACY, KVGATE_SIM_FP8_LOSS,
KVGATE_SIM_FP8_CHURN, KVGATE_GSM8K_DIR, KVGATE_SIM_SPEED, KVGATE_SIM_LOAD; plus
KVGATE_SIM_SEED (default `kvgate`), the seed of the per-question right/wrong draw.

GSM8K questions (last `Question:`/`Q:`/`Problem:` in the prompt or last user message) are
answered right or wrong by a deterministic draw per question, ending in `#### N` (gsm8k),
`The answer is N.` (gsm8k_cot) or `The final answer is N` (gsm8k_cot_llama). Latencies in
/metrics are engine seconds (modelled step times), whatever KVGATE_SIM_SPEED is.

It imports nothing from the rest of kvgate: its text comes from the engines' own output
(reference/engines.md), so tests of kvgate against it are not circular.
"""
