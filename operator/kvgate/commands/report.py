"""`kvgate report NAME`: show a KVCacheRollout's findings, accuracy, capacity and verdict."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Final

from kvgate import report
from kvgate.commands import catalog
from kvgate.errors import ParseError

HELP = catalog.help_of("report")
EXAMPLES: Final = (
    "kvgate report vllm-fp8 -n llm --html report.html",
    "kubectl get kvr vllm-fp8 -o json | kvgate report -f -",
    "kvgate report vllm-fp8 -n llm --exit-status   # exit 0 passed, 1 rolled back, 3 not ended",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", help="KVCacheRollout name (with --file: picks one from a list)"
    )
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig's)")
    parser.add_argument(
        "-f",
        "--file",
        help="read the rollout from a `kubectl get kvr -o json|yaml` file (- = stdin)",
    )
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument(
        "--exit-status",
        action="store_true",
        help="exit as `kvgate wait` would on this reading: 0 promoted, not needed or a reported "
        "pass; 1 rolled back, failed or a closed gate; 3 not ended",
    )


def run(args: argparse.Namespace) -> int:
    if args.file:
        from kvgate.adapters.report_source import read_rollout_file

        rollout = read_rollout_file(args.file, args.name)
    elif args.name:
        from kvgate.adapters.report_source import read_rollout

        rollout = read_rollout(args.name, args.namespace)
    else:
        raise ParseError("kvgate report", "give a rollout NAME or --file FILE")
    view = report.view_of(rollout)  # read once; every output renders this view
    if args.html:
        try:
            Path(args.html).write_text(report.page.render(view), encoding="utf-8")
        except OSError as exc:
            raise ParseError(args.html, f"cannot write: {exc.strerror}") from exc
    if args.json:
        print(json.dumps(summary(view), sort_keys=True))
    else:
        sys.stdout.write(report.text.render(view))
        if args.html:
            print(f"\nHTML report: {args.html}")
    if args.exit_status:
        from kvgate.commands.rollout_view import RolloutView

        return RolloutView.of(rollout).exit_code()
    return 0


def summary(view: report.ReportView) -> dict[str, Any]:
    """What scripts want from a report: identity, phase, findings, figures, args."""
    head, acc = view.header, view.accuracy
    return {
        "kind": "kvgate.report",
        "namespace": head.namespace,
        "name": head.name,
        "phase": head.phase,
        "message": head.message,
        "findings": [dataclasses.asdict(f) for f in view.findings],
        "accuracy": dataclasses.asdict(acc) if acc is not None else None,
        "kvTokens": view.kv_tokens,
        "capacityRatio": view.capacity_gain,
        "recommendedArgs": view.args,
    }
