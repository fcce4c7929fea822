"""The Dockerfile, checked without a Docker engine: targets, entrypoints, extras, user, pins."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvgate.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"cannot parse FROM {rest!r}"
            base = re.sub(r"\$\{?(\w+)\}?", lambda g: args[g.group(1)], m.group(1))
            stages.append(Stage(m.group(2) or str(len(stages)), base))
        else:
            stages[-1].instructions.append((op, rest))
    return args, stages


ARGS, STAGES = parse((ROOT / "Dockerfile").read_text())
BY_NAME = {s.name: s for s in STAGES}
TARGETS = {"operator": "run", "eval": "eval", "load": "load-job"}


def chain(stage: Stage) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    out = [stage]
    while out[-1].base in BY_NAME:
        out.append(BY_NAME[out[-1].base])
    return out


def effective(stage: Stage, op: str) -> str | None:
    """The last `op` instruction in effect for `stage` (inherited through FROM)."""
    for s in chain(stage):
        values = [rest for o, rest in s.instructions if o == op]
        if values:
            return values[-1]
    return None


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for s in reversed(chain(stage)):
        for op, rest in s.instructions:
            if op == "ENV":
                env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target_exists(target: str) -> None:
    assert target in BY_NAME


@pytest.mark.parametrize(("target", "command"), sorted(TARGETS.items()))
def test_entrypoint_is_a_kvgate_command(target: str, command: str) -> None:
    entry = json.loads(effective(BY_NAME[target], "ENTRYPOINT") or "null")
    assert entry == ["kvgate", command]
    assert command in COMMANDS
    assert importlib.util.find_spec(COMMANDS[command]) is not None, (
        f"`kvgate {command}` has no module {COMMANDS[command]} yet"
    )


def test_operator_default_args_watch_every_namespace() -> None:
    cmd = json.loads(effective(BY_NAME["operator"], "CMD") or "null")
    assert cmd == ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
    assert "EXPOSE 8080" in (ROOT / "Dockerfile").read_text()


def test_pip_installs_name_extras_that_exist() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    installs = [
        rest
        for s in STAGES
        for op, rest in s.instructions
        if op == "RUN" and re.search(r"\bpip\b.*\binstall\b", rest)
    ]
    named = {
        e.strip()
        for i in installs
        for group in re.findall(r"\.\[([^\]]+)\]", i)
        for e in group.split(",")
    }
    assert named == {"eval"}
    assert named <= extras


def test_eval_target_gets_the_eval_extra_and_operator_does_not() -> None:
    def installs(target: str) -> str:
        stages = chain(BY_NAME[target])
        copied = [
            rest
            for s in stages
            for op, rest in s.instructions
            if op == "COPY" and "--from=" in rest
        ]
        sources = {re.search(r"--from=(\S+)", c).group(1) for c in copied}  # type: ignore[union-attr]
        return " ".join(
            rest
            for src in sources
            for s in chain(BY_NAME[src])
            for op, rest in s.instructions
            if op == "RUN"
        )

    assert ".[eval]" in installs("eval")
    assert ".[eval]" not in installs("operator")


def test_base_image_is_pinned() -> None:
    external = {s.base for s in STAGES if s.base not in BY_NAME}
    assert external
    for image in external:
        assert re.fullmatch(r"python:3\.1[12]\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), (
            image
        )


def test_load_target_runs_inference_perf_pinned_on_python_312() -> None:
    # inference-perf 0.7.0 requires Python >= 3.12; the other images stay on 3.11.
    (root,) = {s.base for s in chain(BY_NAME["load"]) if s.base not in BY_NAME}
    assert root.startswith("python:3.12."), root
    assert BY_NAME["operator"].base != root and chain(BY_NAME["eval"])[-1].base != root
    copied = [rest for op, rest in BY_NAME["load"].instructions if op == "COPY"]
    assert copied == ["--from=build-load /opt/kvgate /opt/kvgate"]
    assert chain(BY_NAME["build-load"])[-1].base == root
    runs = " ".join(rest for op, rest in BY_NAME["build-load"].instructions if op == "RUN")
    requirements = "operator/kvgate/load/requirements.txt"
    assert f"-r {requirements}" in runs
    pins = [
        line.strip()
        for line in (ROOT / requirements).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert pins == ["inference-perf==0.7.0"]
    # the runner finds the tool in the image's venv, not in a repository's .venv-load
    assert env_of(BY_NAME["load"])["KVGATE_INFERENCE_PERF"] == "/opt/kvgate/bin/inference-perf"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_runs_as_a_numeric_non_root_user(target: str) -> None:
    user = effective(BY_NAME[target], "USER")
    assert user is not None
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_writable_dirs_are_under_tmp(target: str) -> None:
    env = env_of(BY_NAME[target])
    for key in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME"):
        assert env[key].startswith("/tmp"), key
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # no .pyc next to the read-only code
    assert effective(BY_NAME[target], "WORKDIR") == "/tmp"


def test_copied_sources_exist_and_pass_dockerignore() -> None:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False
        for p in patterns:
            negate, pat = p.startswith("!"), p.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                verdict = not negate
        return verdict

    for stage in STAGES:
        for op, rest in stage.instructions:
            if op != "COPY" or "--from=" in rest:
                continue
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert not ignored(src), f"{src} is excluded by .dockerignore"
    assert ignored(".venv") and ignored("tests/unit/test_dockerfile.py")


def test_operator_default_command_line_parses() -> None:
    # (The eval image has no default: the Job passes the arm URLs.)
    from kvgate.cli import build_parser

    entry = json.loads(effective(BY_NAME["operator"], "ENTRYPOINT") or "null")
    cmd = json.loads(effective(BY_NAME["operator"], "CMD") or "[]")
    argv = [*entry[1:], *cmd]
    args = build_parser(argv).parse_args(argv)  # exits 2 on an unknown flag
    assert (args.command, args.all_namespaces) == ("run", True)
    assert args.liveness == "http://0.0.0.0:8080/healthz"


def test_load_entrypoint_takes_the_command_the_operator_builds() -> None:
    from kvgate.change.manifests import load_command
    from kvgate.cli import build_parser

    entry = json.loads(effective(BY_NAME["load"], "ENTRYPOINT") or "null")
    built = load_command(
        control_url="http://10.0.0.1:8000",
        candidate_url="http://10.0.0.2:8000",
        model="Qwen/Qwen3-8B",
        production_concurrency=64,
        prompt_tokens=512,
        output_tokens=128,
        max_concurrency=128,
    )
    assert built[:2] == entry
    args = build_parser(built[1:]).parse_args(built[1:])  # exits 2 on an unknown flag
    assert (args.command, args.production_concurrency, args.num_workers) == ("load-job", 64, 1)


def test_the_image_venv_gets_no_pip_and_no_bytecode() -> None:
    # pip runs from its own venv in the build stage; what the targets copy is /opt/kvgate only.
    runs = [rest for s in STAGES for op, rest in s.instructions if op == "RUN"]
    into_image = [r for r in runs if re.search(r"--python /opt/kvgate/bin/python install", r)]
    assert into_image, "no pip install into /opt/kvgate"
    assert all("--no-compile" in r for r in into_image)
    assert any("venv --without-pip /opt/kvgate" in r for r in runs)
    for target in TARGETS:
        copies = [
            rest for s in chain(BY_NAME[target]) for op, rest in s.instructions if op == "COPY"
        ]
        assert not any("/opt/pip" in c for c in copies)


def test_what_the_image_trims_is_never_imported_by_kvgate() -> None:
    # The build deletes kubernetes/aio and uninstalls hf-xet; every kvgate module must import
    # without them (a blocker raises ImportError on any import of those names).
    runs = [rest for s in STAGES for op, rest in s.instructions if op == "RUN"]
    assert sum("trim-venv /opt/kvgate" in r for r in runs) == 2  # the operator's and eval's venv
    script = (ROOT / "hack/trim-venv.sh").read_text()
    trimmed = ["kubernetes.aio"] if "site-packages/kubernetes/aio" in script else []
    trimmed += ["hf_xet"] if "uninstall --yes --quiet hf-xet" in script else []
    assert trimmed == ["kubernetes.aio", "hf_xet"], "the test no longer matches trim-venv.sh"
    code = f"""
import importlib, importlib.abc, pkgutil, sys
BLOCKED = {trimmed!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{{name}} is not in the image")
        return None
sys.meta_path.insert(0, Block())
import kvgate
for mod in pkgutil.walk_packages(kvgate.__path__, "kvgate."):
    if not mod.name.endswith(".__main__"):  # those run a command line
        importlib.import_module(mod.name)
print("imported", len(sys.modules))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("imported")


def test_make_images_builds_every_target_and_refuses_an_unknown_one() -> None:
    script = ROOT / "hack/build-images.sh"
    text = script.read_text()
    (default,) = re.findall(r"^TARGETS=\$\{KVGATE_IMAGES:-([^}]*)\}$", text, re.MULTILINE)
    assert sorted(default.split()) == sorted(TARGETS)  # operator, eval and load
    # the load target gets a Python 3.12+ base (Debian 13's 3.13 unless LOAD_PYTHON_IMAGE)
    assert "debian_base trixie" in text and '"LOAD_PYTHON_IMAGE=$LOAD_BASE"' in text
    proc = subprocess.run(
        [str(script)], env={"PATH": "/usr/bin:/bin", "KVGATE_IMAGES": "operator lod"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == ("build-images: KVGATE_IMAGES: no target 'lod' (operator, eval, load)\n")
    assert proc.stdout == ""
