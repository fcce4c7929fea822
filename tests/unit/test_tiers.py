"""The suite's tiers (tests/conftest.py) in a scratch project: what runs by default, what each
flag opts in, the order, and a test put in two tiers refused."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\n"
        "markers =\n    lmeval: x\n    tools: x\n    e2e: x\n    harness: x\n    integration: x\n"
    )
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_fast="def test_fast(): pass",
        test_lm="import pytest\n\n@pytest.mark.lmeval\ndef test_lm(): pass",
    )
    for tier in ("e2e", "harness"):  # no marker in the module: the directory gives it
        (pytester.path / tier).mkdir()
        (pytester.path / tier / f"test_{tier}.py").write_text(f"def test_{tier}(): pass\n")
    return pytester


def test_no_flags_runs_only_the_fast_tier_and_names_the_flags(project: pytest.Pytester) -> None:
    result = project.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=3)
    for tier in ("lmeval", "e2e", "harness"):
        result.stdout.fnmatch_lines([f"*{tier} tier: opt in with --with-{tier}*"])


@pytest.mark.parametrize("tier", ["lmeval", "e2e", "harness"])
def test_a_flag_and_its_marker_select_exactly_that_tier(
    project: pytest.Pytester, tier: str
) -> None:
    result = project.runpytest(f"--with-{tier}", "-m", tier, "-v")
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines([f"*::test_{'lm' if tier == 'lmeval' else tier} PASSED*"])


def test_every_tier_runs_with_the_slow_ones_last(project: pytest.Pytester) -> None:
    result = project.runpytest("--all-tiers", "-v")
    result.assert_outcomes(passed=4)
    ran = [line.split("::")[1].split()[0] for line in result.outlines if " PASSED" in line]
    assert ran == ["test_fast", "test_lm", "test_e2e", "test_harness"]


def test_the_fast_tier_is_everything_but_the_three_markers(project: pytest.Pytester) -> None:
    result = project.runpytest("-m", "not lmeval and not e2e and not harness")
    result.assert_outcomes(passed=1, deselected=3)


def test_a_test_in_two_tiers_is_refused(project: pytest.Pytester) -> None:
    (project.path / "e2e" / "test_both.py").write_text(
        "import pytest\n\n@pytest.mark.lmeval\ndef test_both(): pass\n"
    )
    result = project.runpytest("--all-tiers")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_both.py::test_both: under tests/e2e/ but marked lmeval*"])


def test_the_longest_e2e_modules_run_first_in_their_tier(project: pytest.Pytester) -> None:
    # test_chaos.py sorts after test_a.py by name; FIRST puts it (then operator_rollouts) ahead,
    # so two xdist workers start on the two longest modules.
    for name in ("test_a", "test_operator_rollouts", "test_chaos"):
        (project.path / "e2e" / f"{name}.py").write_text(f"def test_{name[5:]}(): pass\n")
    # importlib: this process may have imported the suite's own test_chaos.py as `test_chaos`.
    result = project.runpytest("--with-e2e", "-m", "e2e", "-v", "--import-mode=importlib")
    ran = [line.split("::")[1].split()[0] for line in result.outlines if " PASSED" in line]
    assert ran == ["test_chaos", "test_operator_rollouts", "test_a", "test_e2e"]


def test_a_variable_a_test_sets_is_gone_for_the_next_test(project: pytest.Pytester) -> None:
    # Code under test may set os.environ for its process (NeedleRunner: HF_HUB_OFFLINE=1); the
    # next test, whatever file or xdist worker order, starts from the environment as it was.
    project.makepyfile(
        test_env=(
            "import os\n\n"
            "def test_sets(): os.environ['KVGATE_TIERS_LEAK'] = '1'; os.environ.pop('HOME', None)\n\n"
            "def test_sees_none():\n"
            "    assert 'KVGATE_TIERS_LEAK' not in os.environ\n"
            "    assert 'HOME' in os.environ\n"
        )
    )
    result = project.runpytest("test_env.py", "-v")
    result.assert_outcomes(passed=2)
