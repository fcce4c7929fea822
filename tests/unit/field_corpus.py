"""Score kvgate.evidence.logs on the field corpus (tests/data/field-logs/corpus.yaml, issue 23).

Each corpus entry names a verbatim log excerpt from a public issue and the facts its text
proves; `score()` scans every excerpt (engine auto-detected, as the gate does for a pod it has
not classified) and checks each fact. Shared by tests/unit/test_field_logs.py and
bench/bench_field_logs.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvgate.evidence.logs import LogScan, scan_log

CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "field-logs"

# Facts with one scalar value each; `findings`/`absent` are lists of finding codes.
SCALAR_KEYS = (
    "engine",
    "version",
    "kv_cache_dtype",
    "attention_backend",
    "failed",
    "ready",
    "kv_tokens",
    "max_concurrency",
    "kv_memory_gib",
    "num_gpu_blocks",
)
LIST_KEYS = ("findings", "absent")


@dataclass(frozen=True, slots=True)
class Check:
    """One expectation of one entry: `key` is e.g. `engine` or `findings:kv-capacity`."""

    entry: str
    key: str
    expected: object
    actual: object
    met: bool


def load_corpus(directory: Path = CORPUS_DIR) -> list[dict[str, Any]]:
    data = yaml.safe_load((directory / "corpus.yaml").read_text(encoding="utf-8"))
    entries: list[dict[str, Any]] = data["entries"]
    for entry in entries:
        unknown = set(entry["expect"]) - set(SCALAR_KEYS) - set(LIST_KEYS)
        if unknown:
            raise ValueError(f"corpus.yaml: {entry['name']}: unknown expectation {sorted(unknown)}")
    return entries


def _version_met(expected: str, actual: str | None) -> bool:
    """`0.8.6` is met by `0.8.6` and `0.8.6.dev0+g4e8c9f5e9`, not by `0.8.60`."""
    if actual is None:
        return False
    if actual == expected:
        return True
    return actual.startswith(expected) and not actual[len(expected)].isdigit()


def _scalar(scan: LogScan, key: str) -> object:
    if key in ("kv_tokens", "max_concurrency", "kv_memory_gib", "num_gpu_blocks"):
        return getattr(scan.capacity, key)
    return getattr(scan, {"version": "engine_version"}.get(key, key))


def _met(key: str, expected: object, actual: object) -> bool:
    if key == "version":
        return _version_met(str(expected), actual if isinstance(actual, str) else None)
    if key == "kv_cache_dtype" and expected == "fp8*":
        return isinstance(actual, str) and actual.startswith("fp8")
    if key in ("max_concurrency", "kv_memory_gib"):
        return isinstance(actual, float) and abs(actual - float(str(expected))) < 0.005
    return actual == expected


def check_entry(entry: Mapping[str, Any], directory: Path = CORPUS_DIR) -> list[Check]:
    name = entry["name"]
    text = (directory / f"{name}.log").read_text(encoding="utf-8")
    scan = scan_log(text, source=name)
    expect: Mapping[str, Any] = entry["expect"]
    checks = []
    for key in SCALAR_KEYS:
        if key in expect:
            actual = _scalar(scan, key)
            checks.append(Check(name, key, expect[key], actual, _met(key, expect[key], actual)))
    codes = set(scan.codes())
    for code in expect.get("findings", ()):
        checks.append(Check(name, f"findings:{code}", True, code in codes, code in codes))
    for code in expect.get("absent", ()):
        checks.append(Check(name, f"absent:{code}", False, code in codes, code not in codes))
    return checks


def score(directory: Path = CORPUS_DIR) -> list[Check]:
    return [check for entry in load_corpus(directory) for check in check_entry(entry, directory)]
