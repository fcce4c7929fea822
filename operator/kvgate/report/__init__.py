"""Render a KVCacheRollout for people: a terminal summary and a self-contained HTML page.

Pure: takes the rollout object as a dict (as `kubectl get kvr NAME -o json` prints it) and
returns text. `view` reads the status into the frozen records of `records` (what is missing is "-", never
guessed), `rows` turns them into the tables both renderers share, `fmt` writes numbers, and
`text`, `page` (HTML) and `svg` (the charts) render. A new chart is a function in `svg` (or a
module of its own) over a `view` record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.report.fmt import shell_command
from kvgate.report.page import render_html
from kvgate.report.records import (
    Accuracy,
    ArmAccuracy,
    ArmCapacity,
    ArmClock,
    Clocks,
    DivergenceBucket,
    Finding,
    Header,
    LogLine,
    LongContextBucket,
    Speed,
    SpeedMetric,
)
from kvgate.report.rows import divergence_rows as _divergence_rows
from kvgate.report.rows import long_context_rows as _long_context_rows
from kvgate.report.svg import (
    render_difference_svg,
    render_load_svg,
    render_long_context_svg,
    render_svg,
)
from kvgate.report.text import render_text
from kvgate.report.view import (
    ARMS,
    args_heading,
    read_accuracy,
    read_approval,
    read_capacity,
    read_capacity_gain,
    read_divergence,
    read_duration,
    read_findings,
    read_headline,
    read_kv_tokens,
    read_load,
    read_log_findings,
    read_long_context,
    read_preflight,
    read_production,
    read_progress,
    read_recommended_args,
    read_remediation,
    read_speed,
    read_verdict,
    split_remedy,
)


def long_context_rows(status: Mapping[str, Any]) -> list[list[str]]:
    """Per context-length bucket of `status`: the long-context table's cells."""
    return _long_context_rows(read_long_context(status))


def divergence_rows(status: Mapping[str, Any]) -> list[list[str]]:
    """Per position bucket of `status`: the divergence table's cells."""
    return _divergence_rows(read_divergence(status))


__all__ = [
    "ARMS",
    "Accuracy",
    "ArmAccuracy",
    "ArmCapacity",
    "ArmClock",
    "Clocks",
    "DivergenceBucket",
    "Finding",
    "Header",
    "LogLine",
    "LongContextBucket",
    "Speed",
    "SpeedMetric",
    "args_heading",
    "divergence_rows",
    "long_context_rows",
    "read_accuracy",
    "read_approval",
    "read_capacity",
    "read_capacity_gain",
    "read_divergence",
    "read_duration",
    "read_findings",
    "read_headline",
    "read_kv_tokens",
    "read_load",
    "read_log_findings",
    "read_long_context",
    "read_preflight",
    "read_production",
    "read_progress",
    "read_recommended_args",
    "read_remediation",
    "read_speed",
    "read_verdict",
    "render_difference_svg",
    "render_html",
    "render_load_svg",
    "render_long_context_svg",
    "render_svg",
    "render_text",
    "shell_command",
    "split_remedy",
]
