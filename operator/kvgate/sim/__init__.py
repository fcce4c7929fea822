"""kvgate.sim: an emulator of vLLM's and SGLang's observable surface, for tests and the demo.

`python -m kvgate.sim vllm serve MODEL ...` or `python -m kvgate.sim sglang --model-path MODEL ...`
prints the engine's startup log for the emulated version, GPU and checkpoint, fails where the
real engine fails, and serves the OpenAI API, /health and /metrics. GSM8K questions are
answered right or wrong by a deterministic per-question draw. Hardware, checkpoint and
faults come from KVGATE_SIM_* variables (docs/contracts.md). It imports nothing from the
rest of kvgate: its text comes from the engines' own output, so tests against it are not
circular.
"""
