"""`kvgate eval --divergence-documents`: the screen runs in the eval Job after GSM8K, and its
block is in the one summary line (lm-eval and HTTP replaced; the screen itself is real)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from test_eval_cli import FakeRunner

import kvgate.commands.diverge as diverge
import kvgate.evaluation.runner as runner_module
from kvgate.cli import main
from kvgate.errors import EvalError
from kvgate.evaluation.runner import Arm
from kvgate.judge.divergence import DocumentLogprobs


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "gsm8k"
    d.mkdir()
    (d / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 400)
    (d / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 50)
    return d


def fake_echo(candidate_wrong_from: int | None) -> Any:
    """Per position a two-token distribution; the candidate's flips past a position."""

    def echo(self: Any, text: str, k: int) -> tuple[DocumentLogprobs, int]:
        n = max(2, len(text) // 4)
        top: list[dict[str, float] | None] = [None]
        for i in range(1, n):
            flipped = self.name == "candidate" and candidate_wrong_from is not None
            if flipped and i >= candidate_wrong_from:
                top.append({"a": -2.3, "b": -0.105})
            else:
                top.append({"a": -0.105, "b": -2.3})
        return DocumentLogprobs(tuple("t" for _ in range(n)), tuple(top)), n

    return echo


def run_eval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path, echo: Any
) -> tuple[int, dict[str, Any]]:
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(runner_module, "LmEvalRunner", FakeRunner)
    FakeRunner.wrong, FakeRunner.explode = frozenset(), None
    monkeypatch.setattr(diverge._Arm, "echo", echo)
    code = main(
        [
            "eval",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
            "--data-dir", str(data_dir),
            "--divergence-documents", "2", "--divergence-max-tokens", "2048",
        ]
    )  # fmt: skip
    out, _ = capsys.readouterr()
    return code, json.loads(out.splitlines()[-1])


def test_a_divergent_candidate_is_flagged_in_the_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    code, summary = run_eval(monkeypatch, capsys, data_dir, fake_echo(1024))
    assert summary["kind"] == "kvgate.eval/summary" and summary["verdict"] == "pass"
    block = summary["divergence"]
    assert (block["kind"], block["verdict"], block["error"]) == ("kvgate.diverge/summary", "flag",
                                                                 None)  # fmt: skip
    assert block["first_flagged"]["bucket"] == "1024-2048"
    assert code == 0  # the screen's verdict is the operator's to weigh (its mode)


def test_a_sound_candidate_passes_the_screen(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    _, summary = run_eval(monkeypatch, capsys, data_dir, fake_echo(None))
    assert summary["divergence"]["verdict"] == "pass"
    assert summary["divergence"]["positions"] > 0


def test_a_screen_error_stays_in_its_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    def refuse(self: Any, text: str, k: int) -> Any:
        raise EvalError(f"{self.name} endpoint: HTTP 400: echo is not supported")

    code, summary = run_eval(monkeypatch, capsys, data_dir, refuse)
    assert summary["verdict"] == "pass" and code == 0
    assert summary["divergence"]["verdict"] == "error"
    assert "echo is not supported" in summary["divergence"]["error"]


def test_long_context_and_divergence_together_keep_the_overall_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    """With both on, `overall` is still the worst of GSM8K and long context (exit code too)."""
    import kvgate.commands.eval as eval_cmd

    def collapsed(request: dict[str, Any], *_: Any) -> dict[str, Any]:
        block = eval_cmd._block_header(request)
        block.update(verdict="fail", reason="worse_than_margin", failing_bucket="8192")
        return block

    monkeypatch.setattr(eval_cmd, "_run_long_context", collapsed)
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(runner_module, "LmEvalRunner", FakeRunner)
    FakeRunner.wrong, FakeRunner.explode = frozenset(), None
    monkeypatch.setattr(diverge._Arm, "echo", fake_echo(1024))
    code = main(
        [
            "eval",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
            "--data-dir", str(data_dir),
            "--long-context-tasks", "niah_single_1", "--context-lengths", "8192",
            "--tokenizer", "/nonexistent",
            "--divergence-documents", "1", "--divergence-max-tokens", "2048",
        ]
    )  # fmt: skip
    summary = json.loads(capsys.readouterr()[0].splitlines()[-1])
    assert summary["verdict"] == "pass"
    assert (summary["overall"]["verdict"], summary["overall"]["bucket"]) == ("fail", "8192")
    assert summary["divergence"]["verdict"] == "flag"
    assert code == 1


@pytest.mark.parametrize(
    ("flags", "max_tokens"),
    [
        (["--max-model-len", "4096"], 4096),  # as the operator: the engine's max model length
        (["--max-model-len", "4096", "--divergence-max-tokens", "2048"], 2048),  # explicit wins
        ([], 8192),  # neither given
    ],
)
def test_screen_documents_default_to_the_engines_max_model_len(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    flags: list[str],
    max_tokens: int,
) -> None:
    (data_dir / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 400)
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(runner_module, "LmEvalRunner", FakeRunner)
    FakeRunner.wrong, FakeRunner.explode = frozenset(), None
    monkeypatch.setattr(diverge._Arm, "echo", fake_echo(None))
    code = main(
        [
            "eval",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
            "--data-dir", str(data_dir), "--json",
            "--divergence-documents", "1", *flags,
        ]
    )  # fmt: skip
    block = json.loads(capsys.readouterr()[0].splitlines()[-1])["divergence"]
    assert code == 0 and block["error"] is None
    assert block["max_tokens"] == max_tokens
    # the documents fill the length, aiming a little below it
    assert 0.9 * max_tokens < max(block["document_tokens"]) <= max_tokens


def run_diverge(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    *extra: str,
    tty: bool,
) -> tuple[int, str]:
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(diverge._Arm, "echo", fake_echo(1024))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    code = main(["diverge", "--control-url", "http://10.0.0.1:8000",
                 "--candidate-url", "http://10.0.0.2:8000", "--data-dir", str(data_dir),
                 "--documents", "2", "--max-tokens", "2048", *extra])  # fmt: skip
    return code, capsys.readouterr().out


def test_diverge_on_a_terminal_prints_a_summary_for_a_person(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    """first-hour #14: `kvgate diverge` printed its JSON line on a terminal."""
    code, out = run_diverge(monkeypatch, capsys, data_dir, tty=True)
    assert code == 1 and "{" not in out
    lines = out.splitlines()
    assert lines[0] == (
        "divergence screen: flag (2 documents of 2048 tokens); flagged positions 1024-2048"
    )
    assert "a bucket is flagged above 10x the control's run-to-run floor (A/A)" in lines[1]
    flagged = [line for line in lines if line.startswith("  positions 1024-2048: ")]
    assert flagged and flagged[0].endswith("; flagged (mean KL and top-1 disagreement)")
    assert "top-1 differs 100.0% vs A/A 0.0%" in flagged[0]
    assert [line for line in lines[2:] if line.endswith("; ok")]  # the buckets before it


@pytest.mark.parametrize(("extra", "tty"), [(("--json",), True), ((), False)])
def test_diverge_prints_json_with_json_or_when_piped(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    extra: tuple[str, ...],
    tty: bool,
) -> None:
    code, out = run_diverge(monkeypatch, capsys, data_dir, *extra, tty=tty)
    (line,) = out.splitlines()
    summary = json.loads(line)
    assert (code, summary["kind"], summary["flagged_buckets"]) == (
        1,
        "kvgate.diverge/summary",
        ["1024-2048"],
    )
