"""`kvgate eval` through kvgate.cli.main with the endpoint check and lm-eval replaced (no sockets)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import kvgate.evaluation.runner as runner_module
from kvgate.cli import main
from kvgate.errors import EvalError
from kvgate.evaluation.records import ArmAnswer
from kvgate.evaluation.runner import Arm
from kvgate.judge.accuracy import LONG_CONTEXT_KIND


class FakeRunner:
    """Stands in for LmEvalRunner: the candidate is wrong on every doc in `wrong`."""

    wrong: frozenset[int] = frozenset()
    explode: BaseException | None = None

    def __init__(self, settings: object, arms: Sequence[Arm], workdir: Path) -> None:
        self.arms = {a.name: a for a in arms}

    def run(self, arm_name: str, doc_ids: Sequence[int]) -> dict[int, ArmAnswer]:
        if self.explode is not None:
            raise self.explode
        print("lm-eval chatter that must not reach stdout")
        out = {}
        for d in doc_ids:
            right = not (arm_name == "candidate" and d in self.wrong)
            out[d] = ArmAnswer(d, f"d{d}", f"p{d}", {"strict-match": right}, {"strict-match": "1"})
        return out


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "gsm8k"
    d.mkdir()
    (d / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 400)
    (d / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    return d


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeRunner]:
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(runner_module, "LmEvalRunner", FakeRunner)
    FakeRunner.wrong, FakeRunner.explode = frozenset(), None
    return FakeRunner


def _eval(capsys: pytest.CaptureFixture[str], data_dir: Path, *extra: str) -> tuple[int, list, str]:
    code = main(
        [
            "eval",
            "--control-url",
            "http://10.0.0.1:8000/v1/completions",
            "--candidate-url",
            "http://10.0.0.2:8000/v1/completions",
            "--data-dir",
            str(data_dir),
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_pass_prints_progress_then_summary_and_writes_output(
    capsys: pytest.CaptureFixture[str], data_dir: Path, tmp_path: Path, fake: type[FakeRunner]
) -> None:
    output = tmp_path / "q.jsonl"
    code, lines, err = _eval(
        capsys, data_dir, "--sequential", "--chunk", "100", "--output", str(output)
    )
    assert code == 0
    assert [line["kind"] for line in lines[:-1]] == ["kvgate.eval/progress"] * (len(lines) - 1)
    summary = lines[-1]
    assert summary["kind"] == "kvgate.eval/summary" and summary["verdict"] == "pass"
    assert summary["arms"]["control"]["model"] == "m"
    assert "lm-eval chatter" in err  # sent to stderr, not stdout
    saved = output.read_text().splitlines()
    assert len(saved) == summary["questions_used"] + 1
    assert json.loads(saved[-1])["verdict"] == "pass"


def test_fail_exits_1(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    fake.wrong = frozenset(range(0, 400, 5))  # a 20-point loss
    code, lines, _ = _eval(capsys, data_dir, "--sequential", "--model", "x")
    assert code == 1
    assert lines[-1]["verdict"] == "fail" and lines[-1]["looks"] == 1


def test_inconclusive_exits_3(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    code, lines, _ = _eval(capsys, data_dir, "--limit", "60")
    assert code == 3
    assert lines[-1]["verdict"] == "inconclusive" and lines[-1]["questions_used"] == 60


def test_endpoint_error_exits_4_with_summary(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    fake.explode = EvalError("candidate endpoint http://x failed after 3 attempts: timeout")
    code, lines, _ = _eval(capsys, data_dir)
    assert code == 4
    assert lines[-1]["verdict"] == "error" and "timeout" in lines[-1]["error"]


def test_bug_still_ends_with_an_error_summary(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    fake.explode = AttributeError("type object 'tqdm' has no attribute '_lock'")
    code, lines, err = _eval(capsys, data_dir)
    assert code == 70
    assert lines[-1]["verdict"] == "error"
    assert lines[-1]["error"].startswith("internal error: AttributeError")
    assert "Traceback" in err


def test_on_a_terminal_progress_and_summary_are_for_a_person(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    fake: type[FakeRunner],
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    fake.wrong = frozenset({3, 150})
    code = main(
        [
            "eval",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
            "--data-dir", str(data_dir), "--sequential", "--chunk", "100",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    assert "{" not in out  # no JSON for a person
    assert out.startswith(
        "verdict: pass\ngsm8k: pass (no loss beyond the margin)\n  candidate minus control"
    )
    assert "  control   100.0% (" in out and "right only on control" in out
    looks = [line for line in err.splitlines() if line.startswith("kvgate eval: look ")]
    assert looks[0] == (
        "kvgate eval: look 1/4: 100 questions, control 100.0%, candidate 99.0% (-1.0 pp); "
        "continuing"
    )
    assert looks[-1].endswith("; pass (no loss beyond the margin)")
    # one line per look taken, as many as the summary reports
    assert f"look {len(looks)} of 4" in out


def test_on_a_terminal_json_gives_only_json(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    fake: type[FakeRunner],
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, lines, err = _eval(capsys, data_dir, "--sequential", "--chunk", "100", "--json")
    assert code == 0
    kinds = [line["kind"] for line in lines]  # every stdout line parsed as JSON
    assert kinds[-1] == "kvgate.eval/summary" and set(kinds[:-1]) == {"kvgate.eval/progress"}
    assert "kvgate eval: look" not in err


def test_on_a_terminal_a_missing_dataset_reads_as_one_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("KVGATE_GSM8K_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    code = main(
        [
            "eval",
            "--control-url", "http://127.0.0.1:9/v1/completions",
            "--candidate-url", "http://127.0.0.1:9/v1/completions",
        ]
    )  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 4
    assert out.startswith("verdict: error\ngsm8k: error\n  error: GSM8K dataset openai/gsm8k:")


# ---- `--task none`: long context alone, without GSM8K ----------------------------------------


@pytest.mark.parametrize(("verdict", "code"), [("pass", 0), ("fail", 1), ("error", 4)])
def test_task_none_runs_long_context_without_gsm8k(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    verdict: str,
    code: int,
) -> None:
    import kvgate.commands.eval as eval_cmd

    def no_gsm8k(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GSM8K was touched under --task none")

    def long_context(request: dict[str, Any], *_: Any) -> dict[str, Any]:
        block = eval_cmd._block_header(request)
        block.update(verdict=verdict, reason=None if verdict == "pass" else "worse_than_margin")
        if verdict == "fail":
            block["failing_bucket"] = "16384"
        if verdict == "error":
            block["error"] = "candidate endpoint: HTTP 500"
        return block

    # GIVEN no GSM8K anywhere: no directory, an empty HF cache, offline
    monkeypatch.delenv("KVGATE_GSM8K_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(runner_module, "LmEvalRunner", no_gsm8k)
    monkeypatch.setattr(runner_module, "resolve_hub_dataset", no_gsm8k)
    monkeypatch.setattr(
        runner_module, "check_endpoint", lambda name, url, model: Arm(name, url, model or "m")
    )
    monkeypatch.setattr(eval_cmd, "_run_long_context", long_context)
    got = main(
        [
            "eval", "--task", "none",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
            "--long-context-tasks", "niah_single_1", "--max-model-len", "32768",
            "--tokenizer", "/nonexistent",
        ]
    )  # fmt: skip
    summary = json.loads(capsys.readouterr()[0].splitlines()[-1])
    # THEN the long-context verdict is the run's, and GSM8K is nowhere in it
    assert got == code
    assert (summary["task"], summary["verdict"], summary["questions_planned"]) == (
        "none",
        verdict,
        0,
    )
    assert summary["long_context"]["context_lengths"] == [4096, 8192, 16384, 32768]
    assert [t["task"] for t in summary["overall"]["tasks"]] == ["long_context"]
    assert summary["overall"]["verdict"] == verdict


def test_task_none_needs_long_context(capsys: pytest.CaptureFixture[str]) -> None:
    got = main(
        [
            "eval", "--task", "none",
            "--control-url", "http://10.0.0.1:8000/v1/completions",
            "--candidate-url", "http://10.0.0.2:8000/v1/completions",
        ]
    )  # fmt: skip
    assert got == 2
    assert (
        "--task: none runs only the long-context task: add --long-context-tasks"
        in (capsys.readouterr()[1])
    )


# ---- first-hour-2 N2, N4, N24 (with tests/unit/test_eval_urls_and_errors.py) ----


def test_eval_with_base_urls_sends_to_the_completions_endpoints(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    code = main(["eval", "--control-url", "http://10.0.0.1:8000",
                 "--candidate-url", "http://10.0.0.2:8000/v1", "--data-dir", str(data_dir)])  # fmt: skip
    out, _ = capsys.readouterr()
    summary = json.loads(out.splitlines()[-1])
    assert code == 0, summary
    assert summary["arms"]["control"]["url"] == "http://10.0.0.1:8000/v1/completions"
    assert summary["arms"]["candidate"]["url"] == "http://10.0.0.2:8000/v1/completions"


@pytest.mark.parametrize("command", ["eval", "diverge"])
def test_a_wrong_path_is_bad_input_before_any_request(
    command: str, capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    # 127.0.0.1:9 refuses: a request sent would be exit 4, not 2
    code = main([command, "--control-url", "http://127.0.0.1:9/v1/models",
                 "--candidate-url", "http://127.0.0.1:9", "--data-dir", str(data_dir)])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"kvgate {command}: error: --control-url: 'http://127.0.0.1:9/v1/models'")


def test_an_eval_error_is_the_summary_on_stdout_and_the_error_line_on_stderr(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    fake.explode = EvalError("candidate endpoint http://10.0.0.2:8000 failed after 3 attempts")
    code = main(["eval", "--control-url", "http://10.0.0.1:8000",
                 "--candidate-url", "http://10.0.0.2:8000", "--data-dir", str(data_dir)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 4
    summary = json.loads(out.splitlines()[-1])
    assert summary["verdict"] == "error" and summary["error"].startswith("candidate endpoint")
    assert err.splitlines()[-1] == (
        "kvgate eval: error: candidate endpoint http://10.0.0.2:8000 failed after 3 attempts"
    )


def test_diverge_with_an_unreachable_arm_prints_the_error_line(
    capsys: pytest.CaptureFixture[str], data_dir: Path
) -> None:
    code = main(["diverge", "--control-url", "http://127.0.0.1:9",
                 "--candidate-url", "http://127.0.0.1:9", "--data-dir", str(data_dir)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 4
    assert json.loads(out.splitlines()[-1])["verdict"] == "error"
    assert err.splitlines()[-1].startswith(
        "kvgate diverge: error: control endpoint http://127.0.0.1:9/v1/models is unreachable"
    )


def test_the_terminal_summary_says_its_reason_in_words(
    capsys: pytest.CaptureFixture[str], data_dir: Path, fake: type[FakeRunner]
) -> None:
    """first-hour-2 N18: "gsm8k: inconclusive (not_shown)" and other enum words."""
    from kvgate.commands.terminal import summary_text

    code, lines, _ = _eval(capsys, data_dir, "--limit", "60")
    assert code == 3
    text = summary_text(lines[-1])
    assert "gsm8k: inconclusive (neither shown)" in text and "not_shown" not in text


@pytest.mark.parametrize(("wrong", "limit"), [(frozenset({1, 7}), "60"), (frozenset(), "60")])
def test_an_open_question_says_about_how_many_questions_would_decide(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    fake: type[FakeRunner],
    wrong: frozenset[int],
    limit: str,
) -> None:
    """first-hour-2 N18: the advice `stats` gives, on eval's terminal summary, as an estimate."""
    from kvgate.judge.stats import questions_needed

    fake.wrong = wrong
    code, lines, _ = _eval(capsys, data_dir, "--limit", limit)
    summary = lines[-1]
    assert (code, summary["verdict"]) == (3, "inconclusive")
    discordance = len(wrong) / int(limit)
    needed = questions_needed(discordance, summary["margin"], summary["confidence"])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    fake.wrong = wrong
    assert main(["eval", "--control-url", "http://10.0.0.1:8000",
                 "--candidate-url", "http://10.0.0.2:8000", "--data-dir", str(data_dir),
                 "--limit", limit]) == 3  # fmt: skip
    out = capsys.readouterr().out
    (advice,) = [line for line in out.splitlines() if "would decide" in line]
    assert advice.startswith(f"  about {needed:,} questions would decide (an estimate: 80% power")
    assert f"at this run's {100 * discordance:.1f}% discordant questions" in advice
    # the fourth line after the figures it rests on; said once
    assert out.count("would decide") == 1 and out.index("difference") < out.index("would decide")


def test_a_decided_eval_gives_no_advice(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_dir: Path,
    fake: type[FakeRunner],
) -> None:
    from kvgate.commands.terminal import advice_text

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["eval", "--control-url", "http://10.0.0.1:8000",
                 "--candidate-url", "http://10.0.0.2:8000", "--data-dir", str(data_dir)]) == 0  # fmt: skip
    assert "would decide" not in capsys.readouterr().out
    below_floor = {"verdict": "inconclusive", "reason": "control_below_floor",
                   "advice": {"questions_needed": 900, "discordance": 0.1}}  # fmt: skip
    assert advice_text(below_floor) is None  # more questions cannot lift the control
    beyond = {**below_floor, "reason": "not_shown", "advice": {"questions_needed": 5000,
                                                               "discordance": 0.2}}  # fmt: skip
    assert (advice_text(beyond) or "").endswith(
        "; more than GSM8K's 1,319: a wider --margin decides)"
    )
    # more questions than the estimate already used: the observed loss, not the count, is why
    spent = {**beyond, "questions_used": 600, "advice": {"questions_needed": 400,
                                                         "discordance": 0.05}}  # fmt: skip
    assert (advice_text(spent) or "").endswith(
        "; this run used 600: its observed difference keeps it open)"
    )


def test_a_bug_in_the_divergence_screen_stays_in_its_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from types import SimpleNamespace

    import kvgate.commands.eval as eval_cmd
    from kvgate.commands import diverge

    def broken(*args: object) -> dict[str, object]:
        raise RuntimeError("a bug in the screen")

    monkeypatch.setattr(diverge, "documents_source", lambda data_dir: ["a document"])
    monkeypatch.setattr(diverge, "run_screen", broken)
    settings = SimpleNamespace(data_dir=tmp_path, hub_files=None)
    block = eval_cmd._run_divergence(diverge.ScreenOptions(), [], settings)  # type: ignore[arg-type]
    assert block["verdict"] == "error" and block["kind"] == diverge.SUMMARY_KIND
    assert block["error"].startswith("internal error:") and "RuntimeError" in block["error"]
    assert "a bug in the screen" in capsys.readouterr().err  # the traceback, for the bug report


def test_a_bug_in_the_long_context_task_stays_in_its_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import kvgate.commands.eval as eval_cmd
    from kvgate.evaluation import long_context, long_context_runner

    def broken(*args: object) -> tuple[int, str]:
        raise RuntimeError("a bug in the needle task")

    monkeypatch.setattr(long_context_runner, "load_tokenizer", broken)
    request = {
        "tasks": ["niah_single_1"], "lengths": [4096], "items": 2, "tokenizer": "t",
        "tokenizer_revision": None, "plan": long_context.LongContextPlan(),
    }  # fmt: skip
    block = eval_cmd._run_long_context(request, None, [], tmp_path, 0)  # type: ignore[arg-type]
    assert block["verdict"] == "error" and block["kind"] == LONG_CONTEXT_KIND
    assert block["error"].startswith("internal error:") and "RuntimeError" in block["error"]
    assert "a bug in the needle task" in capsys.readouterr().err
