"""`kvgate check`: can a Deployment be a rollout's target? From a manifest file or the cluster.

The check itself is `kvgate.judge.target` (the operator runs it in Pending too); this command
reads the objects and prints one line per problem with its fix, then what a rollout of the
target needs. Exit 0: no error (warnings may remain), 1: an error a rollout would fail on,
2: the file or options are wrong, 4: the cluster could not be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from kvgate.commands.exit_codes import EXIT_GATE_FAILED, EXIT_OK
from kvgate.commands.rollout_view import metadata
from kvgate.errors import InputError, ParseError
from kvgate.inputs import kube_name
from kvgate.judge import target as targetcheck

EXAMPLES: Final = (
    "kvgate check -f deployment.yaml          # offline: the Deployment, its Service and PVCs",
    "kvgate check --deployment vllm -n llm    # live, with the namespace's Services and PVCs",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--file",
        help="a manifest (multi-document YAML or JSON, - = stdin): one Deployment, and the "
        "Services and PersistentVolumeClaims that go with it",
    )
    parser.add_argument(
        "--deployment",
        metavar="NAME",
        type=kube_name(),
        help="the Deployment to check in the cluster (with --file: which one of the file's)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        type=kube_name(label=True),
        help="namespace (default: the kubeconfig's; with --file: the manifest's, "
        "where it will be applied)",
    )
    parser.add_argument(
        "-c",
        "--container",
        help="the engine's container, as spec.targetRef.container (default: the first)",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.epilog = (
        "One line per problem with its fix: an error is a target no rollout can reach a verdict "
        "on (the operator ends one InvalidTarget in Pending), a warning may cost the rollout. "
        "Exit 0 no error, 1 an error, 2 a bad file or option, 4 the cluster could not be read."
    )


def run(args: argparse.Namespace) -> int:
    if args.file:
        result = _check_file(args.file, args.deployment, args.container, args.namespace)
    elif args.deployment:
        from kvgate.adapters.kube_cli import for_cli

        kube, namespace = for_cli(args.namespace)
        live = kube.read_target(namespace, args.deployment)
        result = targetcheck.check(
            live.deployment, container=args.container, services=live.services, claims=live.claims
        )
        unread = [w for w, v in (("Services", live.services), ("PVCs", live.claims)) if v is None]
        if unread:
            note = f"note: could not list the namespace's {' and '.join(unread)}: not checked"
            result = dataclasses.replace(result, needs=(*result.needs, note))
    else:
        raise InputError("give --file FILE (a manifest) or --deployment NAME (in the cluster)")
    print(json.dumps(result.to_dict(), sort_keys=True) if args.json else "\n".join(lines(result)))
    return EXIT_GATE_FAILED if result.errors else EXIT_OK


def lines(result: targetcheck.TargetCheck) -> list[str]:
    """The report: what was checked, one line per finding (errors first), the needs, a total."""
    out = [f"Deployment {result.deployment}, container {result.container or '?'}"]
    out += [f.line() for f in result.errors + result.warnings]
    out += result.needs
    errors, warnings = len(result.errors), len(result.warnings)
    if errors:
        verdict = f"{_count(errors, 'error')}, {_count(warnings, 'warning')}: fix the errors "
        verdict += "before any rollout (the operator ends one on this target InvalidTarget)"
    elif warnings:
        verdict = f"passed with {_count(warnings, 'warning')}: read each before a rollout"
    else:
        verdict = "passed"
    return [*out, f"result: {verdict}"]


def _check_file(
    path: str, name: str | None, container: str | None, namespace: str | None
) -> targetcheck.TargetCheck:
    from kvgate.inputs import load_documents

    docs = load_documents(path)  # bounded: size, UTF-8, depth, no YAML aliases
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for doc in docs:
        if not isinstance(doc, Mapping):
            raise ParseError(path, f"holds a {type(doc).__name__}, not a Kubernetes object")
        by_kind.setdefault(str(doc.get("kind")), []).append(doc)
    deployments = by_kind.get("Deployment", [])
    names = [str(metadata(d).get("name")) for d in deployments]
    if not deployments:
        kinds = ", ".join(sorted(by_kind)) or "nothing"
        raise ParseError(path, f"holds no Deployment (found {kinds}); kvgate checks a Deployment")
    if name is not None:
        if name not in names:
            raise ParseError(path, f"no Deployment {name!r} (found {', '.join(names)})")
        deployment = deployments[names.index(name)]
    elif len(deployments) > 1:
        raise ParseError(
            path,
            f"{len(deployments)} Deployments ({', '.join(names)}); pick one with --deployment NAME",
        )
    else:
        deployment = deployments[0]
    if namespace:  # where it will be applied (the chart's watch.namespaces must hold it)
        deployment = {**deployment, "metadata": {**metadata(deployment), "namespace": namespace}}
    claims = {str(metadata(c).get("name")): c for c in by_kind.get("PersistentVolumeClaim", [])}
    return targetcheck.check(
        deployment, container=container, services=by_kind.get("Service", []), claims=claims
    )


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
