"""Every `kvgate` subcommand: its module and its one-line help, in the order `--help` lists them.

`kvgate --help` lists the commands from here without importing them (a command module may
import numpy, scipy or lm-eval); each command module takes its `HELP` from here too, so the
line is written once.
"""

from __future__ import annotations

from typing import Final

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "preflight": (
        "kvgate.commands.preflight",
        "KV bytes per token, tokens per GiB and checkpoint KV scales of a model (dir, repo id or config.json)",
    ),
    "check": (
        "kvgate.commands.check",
        "check a Deployment (manifest file or live) as a rollout target: engine, /metrics, GPUs, probes, volumes, model",
    ),
    "scan-logs": (
        "kvgate.commands.scan_logs",
        "scan a vLLM or SGLang startup log for KV dtype, scales, attention backend and failures",
    ),
    "scrape": (
        "kvgate.commands.scrape",
        "read an engine's /metrics: KV usage, queue, latency and whether the KV pool is the limit",
    ),
    "stats": (
        "kvgate.commands.stats",
        "accuracy statistics: Wilson intervals, paired non-inferiority, saved eval results",
    ),
    "eval": (
        "kvgate.commands.eval",
        "run the paired GSM8K accuracy job against a control and a candidate endpoint",
    ),
    "load-job": (
        "kvgate.commands.load_job",
        "run inference-perf against a control and a candidate endpoint at once (the load Job)",
    ),
    "diverge": (
        "kvgate.commands.diverge",
        "token-level divergence screen: candidate vs control log-probs by context position",
    ),
    "report": (
        "kvgate.commands.report",
        "show a KVCacheRollout as a readable report (text, --html FILE, or --json)",
    ),
    "get": (
        "kvgate.commands.get",
        "show a KVCacheRollout's phase, gates, eval progress and Events (--watch: until it ends)",
    ),
    "wait": (
        "kvgate.commands.wait",
        "wait until a KVCacheRollout ends: exit 0 promoted, not needed or reported, 1 rolled back, failed, declined (pullRequest mode) or a closed gate (gate mode), 3 still running at --timeout",
    ),
    "approve": (
        "kvgate.commands.approve",
        "approve the tested config of a KVCacheRollout awaiting approval (manual mode)",
    ),
    "abort": (
        "kvgate.commands.abort",
        "abort a KVCacheRollout (kvgate.io/abort); a patched Deployment is reverted first",
    ),
    "run": (
        "kvgate.commands.run",
        "run the KVCacheRollout operator",
    ),
}


def help_of(command: str) -> str:
    """The one-line help of `command`."""
    return COMMANDS[command][1]
