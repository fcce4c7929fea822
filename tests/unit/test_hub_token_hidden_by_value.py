"""No hub token leaks, whatever it looks like: `redact.scrub_text` only knows credential
shapes (hf_..., Bearer ...), so where kvgate holds the token it hides it by value.

- The operator's checkpoint scan: a hub read that fails with an error quoting the token it sent
  (a transport error echoing a header) leaves no trace of it in status, Events or the report
  ConfigMap.
- The Jobs' summaries (`commands.failure.error_text`): an error quoting the `HF_TOKEN` the Job
  was given reaches the summary line, which the operator puts in status, without it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_controller import World

from kvgate.adapters import hub
from kvgate.commands.failure import error_text
from kvgate.errors import EvalError, HubError

# Not an hf_ token, no Bearer prefix: nothing in its shape says "credential".
TOKEN = "mirror0123456789secretvalue"
HUB_MODEL = {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "hf", "key": "token"}}


@pytest.mark.parametrize(
    "echo",
    [
        f"sent X-Mirror-Token: {TOKEN}",
        f"header value {TOKEN!r} rejected",
        f"b'{TOKEN}' in request line",
    ],
)
def test_a_hub_error_quoting_the_token_never_reaches_status(
    monkeypatch: pytest.MonkeyPatch, echo: str
) -> None:
    world = World(monkeypatch, model=HUB_MODEL)
    world.memo.config = dataclasses.replace(
        world.memo.config, hub_token_secrets=True, hub_offline=False
    )
    world.kube.add_secret("hf", TOKEN, {"kvgate.io/hub-token": "true"})
    sent: list[str | None] = []

    def failing(model: str, *, revision: str | None = None, token: str | None = None) -> None:
        sent.append(token)
        raise HubError(f"{model}: connection reset: {echo}")

    monkeypatch.setattr(hub, "read_hub_checkpoint", failing)
    world.run()
    assert sent == [TOKEN]  # the scan did read the Secret and send it
    checkpoint = world.obj["status"]["preflight"]["checkpoint"]
    assert "connection reset" in checkpoint["finding"]  # the failure is still said
    everything = json.dumps(world.obj) + json.dumps(world.events)
    everything += json.dumps([c for c in world.kube.of_kind("ConfigMap")])
    assert TOKEN not in everything and TOKEN[:12] not in everything


@pytest.mark.parametrize("expected", [True, False])
def test_a_jobs_summary_error_never_carries_its_hub_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], expected: bool
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # an expected failure and a bug alike; the token straddles the cut of a bug's text at 300
    # characters, so a cut made before the token is hidden would keep its start
    quoting = EvalError if expected else RuntimeError
    exc = quoting(f"tokenizer fetch failed: {'x' * 260} {TOKEN}")  # 15 of it before the cut
    try:
        raise exc
    except Exception as raised:  # as the commands call it: while the exception is handled
        said = error_text(raised, EvalError)
    assert "tokenizer fetch failed" in said
    assert TOKEN not in said and TOKEN[:6] not in said
    assert said.startswith("internal error: RuntimeError: ") is not expected
    # a bug's traceback goes to stderr, the Job's log: without the token either
    err = capsys.readouterr().err
    assert ("Traceback" in err) is not expected and TOKEN[:6] not in err
    monkeypatch.delenv("HF_TOKEN")
    assert TOKEN in error_text(EvalError(f"token {TOKEN}"), EvalError)  # none given: none known


def test_a_bug_in_a_command_quoting_its_hub_token_leaves_it_out_of_every_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvgate import cli
    from kvgate.commands import stats

    def broken(args: object) -> int:
        raise RuntimeError(f"boom while sending {TOKEN}")

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(stats, "run", broken)
    assert cli.main(["stats", "--paired", "1,2,3,4", "--json"]) == cli.EXIT_BUG
    out, err = capsys.readouterr()
    assert "Traceback" in err and "boom while sending <redacted>" in err
    assert TOKEN[:6] not in out + err
