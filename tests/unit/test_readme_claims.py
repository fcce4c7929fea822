"""Lists in the README and examples/README that must match the code (first-hour-2 N20)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kvgate import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_commands_without_json_are_the_ones_the_readme_names() -> None:
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"every command but (.+?) takes `--json`", readme)
    assert sentence is not None
    named = set(re.findall(r"`([a-z-]+)`", sentence.group(1)))
    without = set()
    for command in cli.COMMANDS:
        parser = cli.build_parser([command])
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
        if not any("--json" in a.option_strings for a in sub._actions):
            without.add(command)
    assert without - {"run"} == named  # `run --json` is its log format, not output


def test_the_examples_readme_names_the_default_columns_of_kubectl_get_kvr() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "kvgate.io_kvcacherollouts.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    comment = re.search(r"kubectl get kvr -w\s+# (.+)", (ROOT / "examples/README.md").read_text())
    assert comment is not None
    assert comment.group(1).split(", ") == [c for c in shown if c != "Age"]
