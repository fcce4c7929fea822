"""`kvgate approve NAME`: approve the config a rollout tested (manual promotion)."""

from __future__ import annotations

import argparse
from typing import Final

from kvgate.commands.rollout_view import RolloutView, name_arguments
from kvgate.errors import SpecError
from kvgate.vocabulary import ANNOTATION_APPROVE, Phase

EXAMPLES: Final = ("kvgate approve vllm-fp8 -n llm",)


def configure(parser: argparse.ArgumentParser) -> None:
    name_arguments(parser)
    parser.epilog = (
        "The approval names the tested config hash (status.configHash): a spec changed since "
        "is not approved by it. The chart's admission policies record who approved and refuse "
        "the rollout's own author."
    )


def run(args: argparse.Namespace) -> int:
    from kvgate.adapters.kube_cli import for_cli

    kube, ns = for_cli(args.namespace)
    view = RolloutView.of(kube.get_rollout(ns, args.name))
    config = view.status.config_hash
    if view.phase is not Phase.AWAITING_APPROVAL or view.status.reported or not config:
        raise SpecError(
            f"kvr/{args.name}",
            f"is {view.phase.value} ({view.status.reason or 'no reason'}), not awaiting approval: "
            "nothing to approve",
        )
    kube.annotate_rollout(ns, view.name, {ANNOTATION_APPROVE: config})
    print(
        f"approved config {config} of kvr/{view.name} in {ns}; the operator promotes it on its "
        f"next reconcile (follow with: kvgate get {view.name} -n {ns} --watch)"
    )
    return 0
