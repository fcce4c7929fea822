"""Every `kvgate` subcommand and its one-line help, in the order `--help` lists them.

`kvgate --help` lists the commands from here without importing them (a command module may
import numpy, scipy or lm-eval), and `kvgate NAME --help` shows the same line, written once.
Command `NAME` lives in `kvgate.commands.NAME` (a dash as `_`).
"""

from __future__ import annotations

from typing import Final

COMMANDS: Final[dict[str, str]] = {
    "preflight": "KV bytes per token, tokens per GiB and checkpoint KV scales of a model (dir, repo id or config.json)",
    "check": "check a Deployment (manifest file or live) as a rollout target: engine, /metrics, GPUs, probes, volumes, model",
    "scan-logs": "scan a vLLM or SGLang startup log for KV dtype, scales, attention backend and failures",
    "scrape": "read an engine's /metrics: KV usage, queue, latency and whether the KV pool is the limit",
    "stats": "accuracy statistics: Wilson intervals, paired non-inferiority, saved eval results",
    "eval": "run the paired GSM8K accuracy job against a control and a candidate endpoint",
    "load-job": "run inference-perf against a control and a candidate endpoint at once (the load Job)",
    "diverge": "token-level divergence screen: candidate vs control log-probs by context position",
    "report": "show a KVCacheRollout as a readable report (text, --html FILE, or --json)",
    "get": "show a KVCacheRollout's phase, gates, eval progress and Events (--watch: until it ends)",
    "wait": "wait until a KVCacheRollout ends: exit 0 promoted, not needed or reported, 1 rolled back, failed, declined (pullRequest mode) or a closed gate (gate mode), 3 still running at --timeout",
    "approve": "approve the tested config of a KVCacheRollout awaiting approval (manual mode)",
    "abort": "abort a KVCacheRollout (kvgate.io/abort); a patched Deployment is reverted first",
    "run": "run the KVCacheRollout operator",
}
