"""The typed rollout status: `from_dict` is total, `to_dict` round-trips, `merge_patch` is RFC 7386,
and every status the fake-cluster controller writes survives the typed record without losing a figure.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import test_approval_rules
import test_controller
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_parsers import FUZZ as PROPERTY
from test_fuzz_parsers import json_values

from kvgate.records import status as status_module
from kvgate.records.evalsummary import AccuracyStatus, progress_line
from kvgate.records.mergepatch import apply_merge_patch, merge_patch
from kvgate.records.status import ArmStatus, RolloutStatus
from kvgate.vocabulary import Outcome, Phase

finite_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
finite_json = st.recursive(
    finite_scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=4)
    ),
    max_leaves=16,
)
json_objects = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), finite_json, max_size=5)


def _shaped(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """A value shaped like the status type `tp` (by every spelling it reads), or any JSON at all:
    so a wrong type lands deep in the status, not only at its top."""
    origin = typing.get_origin(tp)
    if depth > 6:
        return json_values
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.one_of(*(_shaped(a, depth) for a in args)) | json_values
    if origin is tuple:
        return st.lists(_shaped(typing.get_args(tp)[0], depth + 1), max_size=3) | json_values
    if origin is Mapping:
        names = st.sampled_from(["control", "candidate", "pod-0", "accuracy", "x"])
        value = _shaped(typing.get_args(tp)[1], depth + 1)
        return st.dictionaries(names, value, max_size=3) | json_values
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        optional = {}
        for f in status_module._fields(tp):
            for key in (f.key, *f.aliases):
                optional[key] = _shaped(f.type, depth + 1)
        return st.fixed_dictionaries({}, optional=optional) | json_values
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp]) | json_values
    return json_values


status_shaped = _shaped(RolloutStatus)


# --- from_dict is total, to_dict round-trips -------------------------------------------------------


@PROPERTY
@given(status_shaped)
def test_any_json_reads_as_a_status_and_round_trips(raw: Any) -> None:
    status = RolloutStatus.from_dict(raw)
    written = status.to_dict()
    json.dumps(written, allow_nan=False)  # finite JSON: the apiserver takes it
    assert RolloutStatus.from_dict(written) == status
    assert RolloutStatus.from_dict(json.loads(json.dumps(written))) == status


@pytest.mark.parametrize(
    "raw",
    [None, 0, "Promoted", [], [{"phase": "Promoted"}], {"phase": 3}, {"phase": "Nope"},
     {"arms": []}, {"arms": {"control": 5}}, {"conditions": {"type": "Ready"}},
     {"accuracy": {"control": {"total": True}}}, {"port": 2.5}, {"speed": {"startedAt": float("nan")}},
     {"previous": {1: "non-str key"}}, {"capacity": {"ratio": float("inf")}}],
)  # fmt: skip
def test_wrong_types_read_as_unknown(raw: Any) -> None:
    status = RolloutStatus.from_dict(raw)
    assert status.phase is None or isinstance(status.phase, Phase)
    assert RolloutStatus.from_dict(status.to_dict()) == status
    assert RolloutStatus.from_dict(raw).to_dict().get("port") is None


# A status as main's dict writer stored it (up to d77d297; the snake_case accuracy keys up to
# 3dfa341): what `oldspellings` keeps readable. tests/e2e/test_crd.py stores it for real.
DICT_WRITER_STATUS: dict[str, Any] = {
    "preflight": {"checkpointHasScales": True,
                  "pressure": {"max_usage": 0.9, "pressured_samples": 3},
                  "samples": {"p": [{"kv_usage": 0.5, "ttft_sum": 2.0, "ttft_count": 4}]}},
    "arms": {"control": {"kvTokens": 7, "attentionBackend": "FLASH_ATTN",
                         "scan": {"kv_cache_dtype": "auto", "engine_version": "0.9.1"}}},
    "capacity": {"candidate": {"kvTokens": 14}, "ratio": 2.0},
    "accuracy": {"questions_used": 500, "stopped_early": False,
                 "paired": {"mcnemar_p": 0.5, "control_only": 3},
                 "control": {"n": 10, "wilson95": [0.1, 0.2]},
                 "bounds": {"lower_confidence": 0.95, "look_adjusted": True},
                 "divergence": {"flagged_buckets": ["0-512"]}},
    "eval": {"progress": {"look": 1, "looks_planned": 4, "questions": 50}},
}  # fmt: skip


def test_a_status_the_dict_writer_stored_still_reads() -> None:
    """The spellings main's writer stored (up to d77d297, and the typed writer's snake_case
    accuracy keys up to 3dfa341) read as the camelCase fields (`oldspellings`)."""
    old = copy.deepcopy(DICT_WRITER_STATUS)
    status = RolloutStatus.from_dict(old)
    new = status.to_dict()
    assert new["preflight"] == {
        "checkpointHasScales": True, "pressure": {"maxUsage": 0.9, "pressuredSamples": 3},
        "samples": {"p": [{"kvUsage": 0.5, "ttftSum": 2.0, "ttftCount": 4}]},
    }  # fmt: skip
    assert new["arms"]["control"]["scan"] == {
        "kvCacheDtype": "auto", "engineVersion": "0.9.1", "attentionBackend": "FLASH_ATTN",
        "capacity": {"kvTokens": 7},
    }  # fmt: skip
    assert new["arms"]["candidate"]["scan"] == {"capacity": {"kvTokens": 14}}
    assert new["accuracy"] == {
        "questionsUsed": 500, "stoppedEarly": False,
        "paired": {"mcnemarP": 0.5, "controlOnly": 3},
        "control": {"total": 10, "wilson95": [0.1, 0.2]},
        "bounds": {"lowerConfidence": 0.95, "lookAdjusted": True},
        "divergence": {"flaggedBuckets": ["0-512"]},
    }  # fmt: skip
    assert status.eval is not None and status.eval.look_progress is not None
    assert status.eval.look_progress.looks_planned == 4


def test_a_spelling_no_release_wrote_is_not_read() -> None:
    """The report's old guesses and the snake_case of keys always written camelCase read as
    unknown: nobody stored them, so nothing is lost."""
    guessed = {
        "recommended_args": ["vllm", "serve"],
        "config_hash": "abc",
        "arms": {"control": {"scan": {"kvDtype": "auto", "backend": "X",
                                      "capacity": {"kvCacheTokens": 7}}}},
        "capacity": {"gain": 2.0, "control": {"kv_tokens": 7, "dtype": "auto"}},
        "accuracy": {"paired": {"ci95": [-0.1, 0.2]}, "control": {"wilson": [0.1, 0.2]}},
        "speed": {"clocks": {"control": {"sm_mhz": 1410.0}}},
        "gates": {"accuracy": {"status": "Successful"}},
        "findings": [{"gate": "accuracy"}],
    }  # fmt: skip
    status = RolloutStatus.from_dict(guessed)
    assert status.recommended_args == () and status.config_hash is None
    scan = status.arms["control"].scan
    assert scan is not None and scan.kv_cache_dtype is None and scan.attention_backend is None
    assert scan.kv_tokens is None
    assert status.capacity is not None and status.capacity.ratio is None
    assert status.accuracy is not None and status.accuracy.paired is not None
    assert status.accuracy.paired.tango95 == ()
    assert status.accuracy.control is not None and status.accuracy.control.wilson95 == ()
    assert status.speed is not None and status.speed.clocks is not None
    assert status.speed.clocks.control is not None and status.speed.clocks.control.sm_mhz is None
    # "status" is not the outcome's key: the outcome is unknown, which a gate reads as Error
    assert status.gates["accuracy"].outcome is Outcome.ERROR
    assert "findings" not in status.to_dict()


def test_the_eval_summary_keeps_what_the_record_does_not_name() -> None:
    summary = {"verdict": "pass", "looks": [{"look": 1}],
               "paired": {"difference": 0.01, "tango95_sided": "two-sided"}}  # fmt: skip
    acc = RolloutStatus.from_dict({"accuracy": summary}).accuracy
    assert acc is not None and acc.verdict == "pass"
    assert acc.more == {"looks": [{"look": 1}]}
    assert RolloutStatus.from_dict({"accuracy": summary}).to_dict()["accuracy"] == summary


def _keys(value: object) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


def test_the_eval_jobs_snake_case_ends_where_the_operator_reads_it() -> None:
    """N14: the Job prints snake_case; status keeps camelCase only, `more` included."""
    summary = {
        "kind": "kvgate.eval/summary", "verdict": "pass", "questions_used": 500,
        "control": {"n": 10, "correct": 9, "accuracy": 0.9, "wilson95": [0.6, 0.98]},
        "paired": {"difference": 0.01, "mcnemar_p": 0.5, "tango95_sided": "two-sided"},
        "bounds": {"lower": -0.01, "lower_confidence": 0.95, "look_adjusted": True,
                   "sides": "one-sided"},
        "looks": [{"look": 1, "fail_boundary": 0.1}],
        "long_context": {"context_lengths": [4096],
                         "buckets": [{"context_length": 4096, "mcnemar_p_one_sided": 0.5}]},
        "divergence": {"flagged_buckets": [], "first_flagged": {"kl_ratio": 2.0}},
    }  # fmt: skip
    acc = AccuracyStatus.from_summary(summary)
    stored = RolloutStatus(accuracy=acc).to_dict()["accuracy"]
    assert [k for k in _keys(stored) if "_" in k] == []
    assert stored["bounds"] == {"lower": -0.01, "lowerConfidence": 0.95, "lookAdjusted": True,
                                "sides": "one-sided"}  # fmt: skip
    assert stored["control"] == {
        "total": 10,
        "correct": 9,
        "accuracy": 0.9,
        "wilson95": [0.6, 0.98],
    }
    assert stored["looks"] == [{"look": 1, "failBoundary": 0.1}]
    assert stored["paired"]["tango95Sided"] == "two-sided"
    assert stored["longContext"]["buckets"] == [{"contextLength": 4096, "mcnemarPOneSided": 0.5}]
    assert stored["divergence"] == {"firstFlagged": {"klRatio": 2.0}}
    assert RolloutStatus.from_dict({"accuracy": stored}).accuracy == acc  # reads back the same
    assert acc.questions_used == 500 and acc.bounds is not None and acc.bounds.look_adjusted
    line = {"kind": "kvgate.eval/progress", "look": 2, "looks_planned": 5, "questions": 200}
    assert progress_line(line) == {"kind": "kvgate.eval/progress", "look": 2, "looksPlanned": 5,
                                   "questions": 200}  # fmt: skip


def test_long_context_and_divergence_buckets_are_typed() -> None:
    summary = {
        "long_context": {"verdict": "pass", "buckets": [
            {"context_length": 4096, "control": {"accuracy": 0.9, "correct": 9, "total": 10},
             "bounds": {"lower": -0.01, "sided": "one-sided"}, "mcnemar_p_one_sided": 0.5}]},
        "divergence": {"buckets": [{"bucket": "0-512", "floor": {"mean_kl": 0.001},
                                    "flagged": False, "reasons": []}]},
    }  # fmt: skip
    acc = RolloutStatus.from_dict({"accuracy": summary}).accuracy
    assert acc is not None and acc.long_context is not None and acc.divergence is not None
    bucket = acc.long_context.buckets[0]
    assert bucket.context_length == 4096 and bucket.bounds is not None
    assert bucket.control is not None and bucket.control.total == 10
    assert (bucket.bounds.lower, bucket.more) == (-0.01, {"mcnemar_p_one_sided": 0.5})
    floor = acc.divergence.buckets[0].floor
    assert floor is not None and floor.mean_kl == 0.001
    assert (acc.long_context.verdict, acc.long_context.more) == ("pass", {})
    assert_no_figure_lost({"accuracy": summary})


# --- merge_patch is RFC 7386 ------------------------------------------------------------------------


def _applied(value: Any) -> Any:
    """What a merge patch leaves of `value`: nulls in objects are absent; arrays are kept whole."""
    if isinstance(value, Mapping):
        return {k: _applied(v) for k, v in value.items() if v is not None}
    return value


@PROPERTY
@given(json_objects, json_objects)
def test_the_merge_patch_applied_to_old_gives_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    before = copy.deepcopy(old)
    patch = merge_patch(old, new)
    assert old == before  # pure
    assert apply_merge_patch(_applied(old), patch) == _applied(new)
    # the controller tests' own RFC 7386 (as the apiserver applies it) agrees
    target = copy.deepcopy(_applied(old))
    test_controller.merge(target, patch)
    assert _applied(target) == _applied(new)


@PROPERTY
@given(json_objects)
def test_no_change_is_no_patch(value: dict[str, Any]) -> None:
    assert merge_patch(value, copy.deepcopy(value)) == {}
    assert merge_patch(value, _applied(value)) == {}


def test_the_patch_names_only_the_changed_keys() -> None:
    old = {"phase": "Canary", "gates": {"a": {"outcome": "Successful"}, "b": {"x": 1}}, "n": [1, 2]}
    new = {"phase": "Canary", "gates": {"a": {"outcome": "Failed"}, "b": {"x": 1}}, "n": [1, 2],
           "m": {"k": None, "j": 1}}  # fmt: skip
    assert merge_patch(old, new) == {"gates": {"a": {"outcome": "Failed"}}, "m": {"j": 1}}
    assert merge_patch(new, {"phase": "Canary"}) == {"gates": None, "n": None, "m": None}
    assert merge_patch({"a": 1}, {"a": 1.0}) == {"a": 1.0}
    assert merge_patch({"a": 1}, {"a": True}) == {"a": True}


# --- every status the controller writes survives the typed record ----------------------------------

# Figures stored more than once today: the typed record keeps the scan's and derives the copy.
DERIVED: dict[tuple[str, ...], Callable[[RolloutStatus, str], Any]] = {
    ("arms", "*", "kvtokens"): lambda s, arm: s.arms[arm].kv_tokens,
    ("arms", "*", "attentionbackend"): lambda s, arm: s.arms[arm].attention_backend,
    ("capacity", "*", "kvtokens"): lambda s, arm: s.arms.get(arm, ArmStatus()).kv_tokens,
}


def _norm(key: str) -> str:
    """One spelling per key: camelCase, snake_case and MHz/GiB read alike."""
    return key.replace("_", "").lower()


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every figure: (normalised path, value); nulls and empty collections carry none."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, (*path, _norm(k)))
    elif isinstance(value, list) and path[:1] not in (("previous",), ("candidate",)):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, str(i)))
    elif value is not None and value != []:
        yield path, value


def _derived(path: tuple[str, ...]) -> Callable[[RolloutStatus, str], Any] | None:
    if len(path) == 3:
        return DERIVED.get((path[0], "*", path[2]))
    return None


def assert_no_figure_lost(raw: Mapping[str, Any]) -> None:
    typed = RolloutStatus.from_dict(raw)
    written = dict(_leaves(typed.to_dict()))
    for path, value in _leaves(raw):
        derive = _derived(path)
        if derive is not None:
            assert derive(typed, path[1]) == value, f"{'/'.join(path)}: {value!r} is not derived"
            assert path not in written, f"{'/'.join(path)} is stored twice"
            continue
        assert path in written, f"{'/'.join(path)} = {value!r} is lost by the typed status"
        assert written[path] == value and type(written[path]) is type(value), "/".join(path)
    raw_paths = {p for p, _ in _leaves(raw)}
    assert set(written) <= raw_paths, f"invented: {set(written) - raw_paths}"
    assert RolloutStatus.from_dict(typed.to_dict()) == typed


def _scenarios() -> list[Callable[[pytest.MonkeyPatch], None]]:
    """The fake-cluster controller tests that take only the monkeypatch fixture (parametrized
    ones repeat the same statuses with other crashes)."""
    out = []
    for module in (test_controller, test_approval_rules):
        for name, fn in vars(module).items():
            takes = inspect.isfunction(fn) and list(inspect.signature(fn).parameters)
            if name.startswith("test_") and takes == ["monkeypatch"]:
                out.append(fn)
    return out


@functools.cache
def fake_cluster_statuses() -> tuple[dict[str, Any], ...]:
    """Every status the fake-cluster controller writes in the scenarios, after each reconcile
    (recorded once per session: tests/unit/test_crd_status_schema.py prunes the same ones)."""
    seen: list[dict[str, Any]] = []
    reconcile = test_controller.World.reconcile

    def recording(world: test_controller.World) -> float:
        delay = reconcile(world)
        seen.append(copy.deepcopy(world.obj.get("status") or {}))
        return delay

    scenarios = _scenarios()
    assert len(scenarios) >= 20
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(test_controller.World, "reconcile", recording)
        for scenario in scenarios:
            with pytest.MonkeyPatch.context() as mp:
                scenario(mp)
    return tuple(seen)


def test_every_status_the_fake_cluster_controller_writes_loses_no_figure() -> None:
    seen = fake_cluster_statuses()
    assert len(seen) > 250
    phases = {s.get("phase") for s in seen}
    assert {"Promoted", "RolledBack", "Reverting", "Verifying", "Canary", "Evaluating"} <= phases
    groups = {path[0] for raw in seen for path, _ in _leaves(raw)}
    assert {"preflight", "arms", "accuracy", "speed", "promotion", "revert", "remediation",
            "capacity", "pendingactions", "verdict", "gates", "conditions"} <= groups  # fmt: skip
    for raw in seen:
        assert_no_figure_lost(raw)


def test_a_dropped_figure_is_caught() -> None:
    raw = {"phase": "Canary", "arms": {"control": {"pod": "p", "newFigure": 1}}}
    with pytest.raises(AssertionError, match="newfigure"):
        assert_no_figure_lost(raw)
    copied = {"arms": {"control": {"kvTokens": 5, "scan": {"capacity": {"kv_tokens": 6}}}}}
    with pytest.raises(AssertionError, match="not derived"):
        assert_no_figure_lost(copied)


def test_the_older_copies_of_an_arms_figures_fill_only_what_its_scan_lacks() -> None:
    # capacity.<arm>.kvTokens and arms.<arm>.kvTokens/attentionBackend were written (up to
    # d77d297); capacity.<arm>.kvCacheDtype/maxConcurrency/attentionBackend never were.
    raw = {
        "capacity": {"control": {"kvCacheDtype": "auto", "kvTokens": 58000, "maxConcurrency": 14.2},
                     "candidate": {"kvTokens": 1, "attentionBackend": "FLASHINFER"}, "ratio": 2.0},
        "arms": {"candidate": {"kvTokens": 2, "attentionBackend": "X",
                               "scan": {"attention_backend": "TRITON_ATTN",
                                        "capacity": {"kv_tokens": 116000}}}},
    }  # fmt: skip
    status = RolloutStatus.from_dict(raw)
    assert status.to_dict() == {
        "arms": {
            "control": {"scan": {"capacity": {"kvTokens": 58000}}},
            "candidate": {"scan": {"attentionBackend": "TRITON_ATTN",
                                   "capacity": {"kvTokens": 116000}}},
        },
        "capacity": {"ratio": 2.0},
    }  # fmt: skip
    assert status.arms["candidate"].kv_tokens == 116000
    assert RolloutStatus.from_dict(status.to_dict()) == status


def test_the_report_reads_the_typed_status() -> None:
    from kvgate import report

    raw = {"phase": "Promoted", "arms": {"control": {"scan": {"capacity": {"kv_tokens": 10}}}},
           "speed": {"control": {"tpotMs": 12.5, "label": "x"}}}  # fmt: skip
    typed = RolloutStatus.from_dict(raw)
    for read in (report.view.read_capacity, report.view.read_speed, report.view.read_findings):
        assert read(typed) == read(raw)
    built = report.view_of({"status": raw})  # the one view the renderers take
    assert (built.capacity, built.speed) == (
        report.view.read_capacity(typed),
        report.view.read_speed(typed),
    )
    speed = report.view.read_speed(typed)
    assert speed is not None and [m.key for m in speed.metrics] == ["tpotMs"]


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("reason", ["VerdictReported", "AwaitingApproval", None])
def test_report_modes_end_is_one_rule(phase: Phase, reason: str | None) -> None:
    from kvgate.vocabulary import ended

    reported = phase is Phase.AWAITING_APPROVAL and reason == "VerdictReported"
    assert ended(phase, reason) is (phase.terminal or reported)
    status = RolloutStatus.from_dict({"phase": phase.value, "reason": reason})
    assert (status.reported, status.ended) == (reported, phase.terminal or reported)


def test_the_eval_progress_line_reads_typed_and_is_written_back_as_the_job_wrote_it() -> None:
    line = {"kind": "kvgate.eval/progress", "look": 2, "looks_planned": 5, "questions": 200,
            "difference": -0.005, "paired": {"n": 200}}  # fmt: skip
    status = RolloutStatus.from_dict({"eval": {"attempt": 1, "progress": line}})
    assert status.eval is not None
    assert status.eval.look_progress == status_module.EvalProgress(
        look=2, looks_planned=5, questions=200, difference=-0.005
    )
    assert status.to_dict()["eval"]["progress"] == line
    # before the first look, or a line without the look's figures: no progress, no guess
    for raw in ({}, {"look": "2", "questions": 200}, {"look": 2}, "look 2"):
        read = RolloutStatus.from_dict({"eval": {"progress": raw}})
        assert read.eval is not None and read.eval.look_progress is None


def test_the_paired_counts_the_eval_job_writes_are_read_into_named_fields() -> None:
    # the Job writes PairedCounts.to_dict(): `both` and `neither` are fields of the record, not
    # open keys beside fields no release wrote (bothRight/bothWrong, declared until 2026-12-07)
    from kvgate.judge.stats import PairedCounts
    from kvgate.records.codec import read_record, write
    from kvgate.records.evalsummary import PairedRecord

    job = PairedCounts(both=400, control_only=10, candidate_only=12, neither=78).to_dict()
    kept = read_record(PairedRecord, job)
    assert (kept.both, kept.control_only, kept.candidate_only, kept.neither) == (400, 10, 12, 78)
    assert kept.more == {}
    assert write(kept) == {"controlOnly": 10, "candidateOnly": 12, "both": 400, "neither": 78}
