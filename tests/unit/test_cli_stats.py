"""`kvgate stats` (and `kvgate eval` input errors) through kvgate.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_wilson_table_reproduces_field_check(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys,
        "stats",
        "--baseline",
        "459/500",
        "--candidate",
        "454/500",
        "--candidate",
        "458/500",
    )
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[1].split() == ["baseline", "459/500", "=", "91.8%", "[89.1,", "93.9]"]
    assert lines[2].split() == ["candidate1", "454/500", "=", "90.8%", "[87.9,", "93.0]"]
    assert lines[3].split() == ["candidate2", "458/500", "=", "91.6%", "[88.8,", "93.7]"]


def test_wilson_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "stats", "--baseline", "459/500", "--candidate", "454/500", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["baseline"]["correct"] == 459 and data["baseline"]["n"] == 500
    low, high = data["baseline"]["wilson95"]
    assert (round(low, 4), round(high, 4)) == (0.8906, 0.939)
    assert [round(x, 4) for x in data["candidate"]["wilson95"]] == [0.8795, 0.9303]


def test_paired_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "stats", "--paired", "452,7,6,35", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["difference"] == pytest.approx(-0.002)
    assert data["noninferior"] is True
    assert data["mcnemar_p"] == pytest.approx(1.0)
    # Losses above the one-sided 95% bound (the 90% Tango lower limit, -1.51 pp) are ruled out.
    assert round(100 * data["largest_loss_ruled_out"], 2) == 1.51
    low, high = data["tango95"]
    assert low < -0.0151 < data["difference"] < high


@pytest.mark.parametrize(
    ("cells", "margin", "confidence", "noninferior"),
    [
        ("449,10,5,36", "0.02", "0.95", False),
        ("449,10,5,36", "0.03", "0.95", True),
        ("452,7,6,35", "0.02", "0.99", False),
    ],
)
def test_paired_margin_and_confidence(
    capsys: pytest.CaptureFixture[str], cells: str, margin: str, confidence: str, noninferior: bool
) -> None:
    code, out, _ = _run(
        capsys, "stats", "--paired", cells, "--margin", margin, "--confidence", confidence, "--json"
    )
    # Not shown non-inferior, and no loss shown either: inconclusive, exit 3 (README's contract).
    assert code == (0 if noninferior else 3)
    data = json.loads(out)
    assert data["noninferior"] is noninferior
    assert data["margin"] == float(margin) and data["confidence"] == float(confidence)


def test_a_paired_analysis_at_a_low_confidence_is_made_not_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --confidence takes (0.5, 1); the control's floor below 0.75 once failed as a two-sided
    # Wilson interval at 2c-1 ("confidence: 0.39999... is not in (0.5, 1)")
    code, out, err = _run(capsys, "stats", "--paired", "80,5,7,8", "--confidence", "0.7", "--json")
    assert "is not in" not in err
    data = json.loads(out)
    assert data["confidence"] == 0.7 and code in (0, 1, 3)


def test_paired_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "stats", "--paired", "449,10,5,36")
    assert code == 3
    assert "non-inferiority not shown" in out
    assert "verdict     inconclusive: 90.8% vs 91.8%" in out
    assert "advice      " in out  # more questions can settle an open question
    assert "control only 10, candidate only 5" in out


def _question_lines(pairs: list[tuple[bool, bool]]) -> str:
    return "".join(
        json.dumps(
            {
                "kind": "kvgate.eval/question",
                "doc_id": i,
                "control_right": c,
                "candidate_right": k,
            }
        )
        + "\n"
        for i, (c, k) in enumerate(pairs)
    )


def test_from_question_jsonl(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "eval.jsonl"
    pairs = [(True, True)] * 90 + [(True, False)] * 3 + [(False, True)] * 2 + [(False, False)] * 5
    path.write_text(_question_lines(pairs))
    code, out, _ = _run(capsys, "stats", "--from", str(path), "--json")
    assert code == 3  # 3 losses to 2 wins in 100 questions: neither shown
    data = json.loads(out)
    assert (data["both"], data["control_only"], data["candidate_only"], data["neither"]) == (
        90,
        3,
        2,
        5,
    )
    assert data["control"]["correct"] == 93 and data["candidate"]["correct"] == 92


def test_from_summary_json_uses_its_margin(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    summary = {
        "kind": "kvgate.eval/summary",
        "verdict": "pass",
        "margin": 0.03,
        "confidence": 0.9,
        "looks": 2,
        "paired": {"both": 452, "control_only": 7, "candidate_only": 6, "neither": 35},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    code, out, _ = _run(capsys, "stats", "--from", str(path), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["n"] == 500 and data["margin"] == 0.03 and data["confidence"] == 0.9
    assert data["eval_verdict"] == "pass"
    code, out, _ = _run(capsys, "stats", "--from", str(path))
    assert code == 0 and "verdict pass after 2 look(s)" in out


@pytest.mark.parametrize("margin", [-0.5, -0.03, 0, 1.5])
def test_a_summary_margin_outside_0_1_is_refused_not_made_positive(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, margin: float
) -> None:
    # a 28-point loss: 0.5 (abs of -0.5) would have called it non-inferior
    summary = {
        "kind": "kvgate.eval/summary",
        "verdict": "pass",
        "margin": margin,
        "confidence": 0.95,
        "paired": {"both": 300, "control_only": 150, "candidate_only": 10, "neither": 40},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code, out, err = _run(capsys, "stats", "--from", str(path), "--json")
    assert code != 0 and "verdict" not in json.loads(out)  # only the --json error object
    assert (
        err.strip().count("\n") == 0 and f"{path}: margin: {float(margin)} is not in (0, 1)" in err
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--baseline", "501/500"], "--baseline: '501/500': 501 right answers out of 500"),
        (["--baseline", "12"], "--baseline: '12' is not K/N"),
        (["--candidate", "3/0"], "--candidate: '3/0' has 0 questions"),
        (["--paired", "1,2,3"], "--paired: '1,2,3' is not four counts"),
        (["--paired", "1,2,-3,4"], "--paired: '1,2,-3,4' is not four counts"),
        (["--paired", "0,0,0,0"], "--paired: '0,0,0,0' has 0 questions"),
        (["--paired", "1,2,3,4", "--margin", "2"], "--margin: 2.0 is not in (0, 1)"),
        # the CRD's margin is in points: a value copied from the YAML gets its fraction named
        (["--paired", "1,2,3,4", "--margin", "2"], "a margin is a fraction; write 0.02 or 2pp"),
        (["--paired", "1,2,3,4", "--margin", "150"], "a margin is a fraction; write 0.02 or 2pp"),
        (["--paired", "1,2,3,4", "--confidence", "95"], "--confidence: 95.0 is not in (0.5, 1)"),
        ([], "kvgate stats: error: give exactly one of"),
        (["--paired", "1,2,3,4", "--baseline", "1/2"], "kvgate stats: error: give exactly one of"),
        (["--from", "/nonexistent/eval.jsonl"], "/nonexistent/eval.jsonl: no such file"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "stats", *argv)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "neither per-question lines nor a kvgate.eval/summary"),
        ('{"kind": "kvgate.eval/summary", "paired": null}', "the summary has no paired counts"),
        ('{"kind": "kvgate.eval/question", "doc_id": 0}\n', "needs doc_id, control_right"),
    ],
)
def test_bad_saved_results(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, _, err = _run(capsys, "stats", "--from", str(path))
    assert code == 2 and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--candidate-url", "127.0.0.1:8000"], "--candidate-url: '127.0.0.1:8000' is not an http"),
        (["--model", "m", "--data-dir", "/nowhere"], "--data-dir: /nowhere is not a directory"),
        (["--model", "m", "--limit", "0"], "--limit: 0 is not positive"),
        (["--model", "m", "--margin", "0"], "margin: 0.0 is not in (0, 1)"),
        (["--model", "m", "--chunk", "-5"], "--chunk: -5 is not positive"),
    ],
)
def test_eval_input_errors_exit_2_before_any_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], message: str
) -> None:
    # Validation comes before the health check, so no request is made (port 9 is unused).
    data = tmp_path / "gsm8k"
    data.mkdir()
    for name in ("test.jsonl", "train.jsonl"):
        (data / name).write_text('{"question": "q", "answer": "#### 1"}\n')
    code, out, err = _run(
        capsys,
        "eval",
        "--control-url",
        "http://127.0.0.1:9/v1/completions",
        "--candidate-url",
        "http://127.0.0.1:9/v1/completions",
        "--data-dir",
        str(data),
        *extra,
    )
    assert code == 2, err
    assert out == ""
    assert message in err and len(err.splitlines()) == 1


def test_paired_json_labels_the_two_sided_interval(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "stats", "--paired", "452,7,6,35", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["tango95_sided"].startswith("two-sided")
    assert data["lower_bound_sided"].startswith("one-sided")
    assert data["lower_bound"] == pytest.approx(-data["largest_loss_ruled_out"])
    assert data["tango95"][0] < data["lower_bound"]
    code, out, _ = _run(capsys, "stats", "--paired", "452,7,6,35")
    assert "Tango 95% two-sided" in out and "one-sided, one look" in out


def test_from_a_sequential_summary_shows_its_look_adjusted_claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from kvgate.evaluation.gate import assess_look, build_summary, plan_gate
    from kvgate.judge.stats import PairedCounts

    plan = plan_gate(1319, chunk=50)
    counts = PairedCounts(596, 4, 0, 100)
    verdict = assess_look(plan, 13, counts).verdict
    assert verdict is not None
    summary = build_summary(plan=plan, task="gsm8k", verdict=verdict, counts=counts, looks_taken=14)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code, out, _ = _run(capsys, "stats", "--from", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["eval"]["reason"] == "noninferior"
    # The one-look figure (1.27 pp) and the eval's, adjusted for 14 looks (1.89 pp).
    assert data["largest_loss_ruled_out"] < 0.013 < data["eval"]["largest_loss_ruled_out"] <= 0.02
    code, out, _ = _run(capsys, "stats", "--from", str(path))
    # the look-adjusted claim, once: in the verdict line (first-hour-2 #13: it came twice)
    verdict_line = next(line for line in out.splitlines() if line.startswith("verdict"))
    assert "candidate minus control ≥ -1.89 pp" in verdict_line
    assert out.count("candidate minus control ≥ -1.89 pp") == 1


def test_a_candidate_shown_worse_exits_1_and_says_so_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 11 pp worse, McNemar p = 4.9e-13: the answer is "no", not "run more questions".
    code, out, _ = _run(capsys, "stats", "--paired", "400,60,5,35")
    assert code == 1
    verdict = next(line for line in out.splitlines() if line.startswith("verdict"))
    assert verdict.startswith("verdict     candidate worse: 81.0% vs 92.0%, worse by at least")
    assert "advice" not in out
    code, out, _ = _run(capsys, "stats", "--paired", "400,60,5,35", "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "fail"
    assert data["verdict_sentence"].startswith("candidate worse")


def test_a_pass_exits_0_and_names_what_it_ruled_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "stats", "--paired", "452,7,6,35")
    assert code == 0
    assert (
        "verdict     non-inferior: 91.6% vs 91.8%, a loss larger than 1.51 pp is ruled out" in out
    )
    assert "advice" not in out


@pytest.mark.parametrize(
    ("saved", "code"),
    [
        ("pass", 0),
        ("fail", 1),
        ("inconclusive", 3),
        ("error", 4),
        ("junk", 3),
        (["pass"], 3),
        (None, 3),
    ],
)
def test_from_a_summary_exits_with_its_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, saved: object, code: int
) -> None:
    summary = {
        "kind": "kvgate.eval/summary",
        "verdict": saved,
        "looks": 3,
        "paired": {"both": 120, "control_only": 25, "candidate_only": 2, "neither": 3},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    got, out, _ = _run(capsys, "stats", "--from", str(path))
    assert got == code
    assert ("advice" in out) is (code == 3)


def test_control_is_the_same_option_as_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the word every other command uses for the unchanged arm
    code, out, _ = _run(capsys, "stats", "--control", "459/500", "--candidate", "454/500")
    # THEN it reads as --baseline does
    assert code == 0
    assert out == _run(capsys, "stats", "--baseline", "459/500", "--candidate", "454/500")[1]
    assert "459/500" in out


@pytest.mark.parametrize(
    ("looks", "paired", "after"),
    [
        (0, None, ""),  # an arm never answered: no paired counts at all
        (3, {"both": 120, "control_only": 25, "candidate_only": 2, "neither": 3}, " after 3 look(s)"),
    ],
)  # fmt: skip
def test_a_saved_eval_error_is_shown_with_exit_4(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    looks: int,
    paired: dict[str, int] | None,
    after: str,
) -> None:
    """first-hour-2 N5: exit 2 "the summary has no paired counts", or the last claim without
    the error; the README's row says stats 4 is "a saved eval's error"."""
    error = "control endpoint http://10.0.0.1:8000/v1/models is unreachable: [Errno 111] refused"
    summary = {"kind": "kvgate.eval/summary", "verdict": "error", "error": error,
               "looks": looks, "paired": paired}  # fmt: skip
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code, out, err = _run(capsys, "stats", "--from", str(path))
    assert (code, out) == (4, "")
    assert err == f"kvgate stats: error: {path}: the eval ended in error{after}: {error}\n"


def test_a_sequential_summary_labels_the_one_look_figures_and_states_its_claim_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """first-hour-2 #13: the fixed-n line read as the verdict's, and the claim came twice."""
    claim = "no loss larger than 1.63 pp (97.5% one-sided, adjusted for 10 looks)"
    summary = {"kind": "kvgate.eval/summary", "verdict": "pass", "claim": claim, "looks": 10,
               "margin": 0.02, "confidence": 0.95,
               "paired": {"both": 440, "control_only": 6, "candidate_only": 8, "neither": 46}}  # fmt: skip
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code, out, _ = _run(capsys, "stats", "--from", str(path))
    assert code == 0
    assert "one look, descriptive (ignores the eval's 10 looks): non-inferior" in out
    assert out.count(claim) == 1


def test_a_fail_rules_nothing_out(capsys: pytest.CaptureFixture[str]) -> None:
    """first-hour-2 N13: "losses above 11.07 pp are ruled out" for a candidate 11 pp worse."""
    code, out, _ = _run(capsys, "stats", "--paired", "400,60,5,35")
    assert code == 1
    assert "ruled out" not in out.replace("nothing is ruled out", "")
    assert "nothing is ruled out (the candidate is shown worse)" in out
