"""`kvgate report NAME`: show a KVCacheRollout's findings, accuracy, capacity and verdict."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Final

from kvgate import report
from kvgate.commands.rollout_view import RolloutView, metadata, name_arguments
from kvgate.errors import ParseError
from kvgate.inputs import load_file

EXAMPLES: Final = (
    "kvgate report vllm-fp8 -n llm --html report.html",
    "kubectl get kvr vllm-fp8 -o json | kvgate report -f -",
    "kvgate report vllm-fp8 -n llm --exit-status   # exit 0 passed, 1 rolled back, 3 not ended",
)


def configure(parser: argparse.ArgumentParser) -> None:
    name_arguments(
        parser, optional=True, help="KVCacheRollout name (with --file: picks one from a list)"
    )
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
        rollout = read_rollout_file(args.file, args.name)
    elif args.name:
        from kvgate.adapters.kube_cli import for_cli

        kube, namespace = for_cli(args.namespace)
        rollout = kube.get_rollout(namespace, args.name)
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


def read_rollout_file(path: str, name: str | None = None) -> dict[str, Any]:
    """A rollout saved with `kubectl get kvr -o json` (or -o yaml); `-` is stdin.

    A list (`kubectl get kvr -o json` without a name) is accepted: `name` picks the item,
    and may be left out when the list holds one rollout.
    """
    obj = load_file(path)  # bounded: size, UTF-8, depth, no YAML aliases
    if isinstance(obj, dict) and isinstance(obj.get("items"), list):
        items = [i for i in obj["items"] if isinstance(i, dict)]
        names = [str(metadata(i).get("name"))[:253] for i in items]
        if name is not None:
            if name not in names:
                raise ParseError(path, f"no rollout {name!r} in the list ({', '.join(names)})")
            obj = items[names.index(name)]
        elif len(items) == 1:
            obj = items[0]
        else:
            raise ParseError(
                path, f"{len(items)} rollouts in the list; name one of: {', '.join(names)}"
            )
    if not isinstance(obj, dict) or obj.get("kind") != "KVCacheRollout":
        raise ParseError(path, "expected one KVCacheRollout object")
    found = metadata(obj).get("name")
    if name is not None and found != name:
        raise ParseError(path, f"holds rollout {str(found)[:253]!r}, not {name!r}")
    return obj
