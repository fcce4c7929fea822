"""The long-context paired task: RULER needle items per context length, judged per bucket.

Items follow lm-eval 0.4.13's RULER `niah_*` tasks (`lm_eval/tasks/ruler/niah_utils.py`,
`prepare_niah.py`): the same template, needle sentence, haystacks (`repeat` for
`niah_single_1`, `needle` for `niah_multikey_2`/`_3`), the same sizing (the largest haystack
whose prompt plus 128 generated tokens fits the length, measured with the model's tokenizer)
and the same scoring (`string_match_all`). They are generated here, once, from a seeded RNG, and
written to one JSONL file that lm-eval's task machinery (`kvgate_niah` task, local-completions)
sends to both arms, so the arms see byte-identical prompts. Why not lm-eval's own RULER task
as is: docs/long-context.md.

Judging is per item and paired, per context-length bucket (`judge_bucket`).
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypedDict

from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.gate import Verdict, worst
from kvgate.judge.stats import PairedCounts, lower_confidence_bound, upper_confidence_bound

TASKS: Final = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
DEFAULT_ITEMS: Final = 50
DEFAULT_MARGIN: Final = 0.10
DEFAULT_RECOVERY: Final = 0.95  # vLLM: calibrate below 95% of the baseline's score
DEFAULT_FAIL_CONFIDENCE: Final = 0.975
MIN_LENGTH: Final = 4096
TOKENS_TO_GENERATE: Final = 128  # RULER's tokens_to_generate and the YAML's max_gen_toks

# lm-eval 0.4.13 lm_eval/tasks/ruler/niah_utils.py TEMPLATE and prepare_niah.py NEEDLE / haystacks
TEMPLATE: Final = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
# one query of one value: RULER's singular wording
_SINGULAR_TEMPLATE: Final = (
    TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is")
)
NEEDLE: Final = "One of the special magic {type_needle_v} for {key} is: {value}."
REPEAT_HAYSTACK: Final = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
# (haystack, type_needle_k, type_needle_v) as niah_utils.py sets them
_VARIANTS: Final = {
    "niah_single_1": ("repeat", "words", "numbers"),
    "niah_multikey_2": ("needle", "words", "numbers"),
    "niah_multikey_3": ("needle", "uuids", "uuids"),
}
# RULER draws keys from wonderwords' adjective-noun pairs; a fixed list keeps the job offline
# without that package (the retrieval task is the same: a hyphenated two-word key).
_ADJECTIVES: Final = (
    "quiet", "sharp", "amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow",
    "icy", "jolly", "keen", "lucky", "mellow", "narrow", "odd", "proud", "rapid", "silent",
    "tidy", "upset", "vivid", "warm", "young", "zesty", "bitter", "cheap", "damp", "early",
    "fancy", "giant", "humble", "idle", "jagged", "kind", "loud", "modern", "noisy", "oval",
)  # fmt: skip
_NOUNS: Final = (
    "harbor", "river", "garden", "lantern", "meadow", "pencil", "rocket", "saddle", "tunnel",
    "violin", "window", "anchor", "basket", "candle", "desert", "engine", "falcon", "glacier",
    "hammer", "island", "jacket", "kettle", "ladder", "mirror", "needle", "orchard", "parrot",
    "quarry", "ribbon", "shadow", "teapot", "valley", "walnut", "yogurt", "zipper", "bridge",
    "cabin", "dragon", "feather", "goblet",
)  # fmt: skip
WORDS: Final = tuple(f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS)

CountTokens = Callable[[str], int]


class NeedleItem(TypedDict):
    """One needle item as written to the task's JSONL file (RULER's fields plus task, length)."""

    index: int
    task: str
    input: str
    outputs: list[str]
    length: int
    max_length: int
    gen_prefix: str


def context_lengths(max_model_len: int, minimum: int = MIN_LENGTH) -> list[int]:
    """4k, 8k, ... up to the largest power of two that fits `max_model_len`."""
    if max_model_len < minimum:
        raise SpecError(
            "--max-model-len", f"{max_model_len} is below the smallest bucket ({minimum})"
        )
    lengths = [minimum]
    while lengths[-1] * 2 <= max_model_len:
        lengths.append(lengths[-1] * 2)
    return lengths


def _random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return rng.choice(WORDS)
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise SpecError("task", f"unknown needle type {kind!r}")


def _render(task: str, num_haystack: int, rng: random.Random) -> tuple[str, list[str], str]:
    """prepare_niah.generate_input_output for one needle, one key, one query."""
    haystack, type_k, type_v = _VARIANTS[task]
    key, value = _random_value(type_k, rng), _random_value(type_v, rng)
    needle = NEEDLE.format(type_needle_v=type_v, key=key, value=value)
    if haystack == "repeat":
        sentences = [REPEAT_HAYSTACK] * num_haystack
    else:
        sentences = [
            NEEDLE.format(
                type_needle_v=type_v,
                key=_random_value(type_k, rng),
                value=_random_value(type_v, rng),
            )
            for _ in range(num_haystack)
        ]
    sentences.insert(rng.randrange(num_haystack + 1), needle)
    context = "\n".join(sentences)
    text = _SINGULAR_TEMPLATE.format(type_needle_v=type_v[:-1], context=context, query=key)
    return text, [value], key


def _haystack_size(task: str, length: int, count: CountTokens, seed: int) -> int:
    """The largest haystack whose prompt plus the answer budget fits `length` tokens."""
    probe = random.Random(seed)

    def fits(size: int) -> bool:
        text = _render(task, size, random.Random(probe.random()))[0]
        return count(text) + TOKENS_TO_GENERATE <= length

    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
        if high > 4 * length:
            raise SpecError("--tokenizer", "the tokenizer under-reports lengths (0 tokens?)")
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def generate_items(
    tasks: Sequence[str], lengths: Sequence[int], items: int, count: CountTokens, seed: int
) -> list[NeedleItem]:
    """`items` needle items per task and length, as lm-eval's RULER docs (plus task, length)."""
    out: list[NeedleItem] = []
    for task in tasks:
        if task not in _VARIANTS:
            raise SpecError("--long-context-tasks", f"{task!r} is not one of {', '.join(TASKS)}")
        for length in lengths:
            size = _haystack_size(task, length, count, seed)
            step = 25 if length >= 4096 else 5  # prepare_niah's `incremental`
            for index in range(items):
                rng_seed = f"{seed}/{task}/{length}/{index}"
                used = size
                while True:
                    text, answers, query = _render(task, used, random.Random(rng_seed))
                    tokens = count(text)
                    if tokens + TOKENS_TO_GENERATE <= length or used <= step:
                        break
                    used -= step
                singular = _VARIANTS[task][2][:-1]
                out.append(
                    {
                        "index": len(out),
                        "task": task,
                        "input": text,
                        "outputs": answers,
                        "length": tokens + TOKENS_TO_GENERATE,
                        "max_length": length,
                        "gen_prefix": f"The special magic {singular} for {query} mentioned in "
                        "the provided text is",
                    }
                )
    return out


def write_items(items: Iterable[NeedleItem], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for item in items:
            handle.write(json.dumps(item) + "\n")


# ---- scoring (lm-eval 0.4.13 lm_eval/tasks/ruler/common_utils.py) ----------------------------


def postprocess_pred(prediction: str) -> str:
    text = prediction.strip()
    return "".join("\n" if ord(ch) < 0x20 else ch for ch in text).strip()


def string_match_all(pred: str, refs: Sequence[str]) -> float:
    return sum(1.0 if r.lower() in pred.lower() else 0.0 for r in refs) / len(refs)


def process_results(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    """lm-eval `process_results`: one `score` per item (share of needle values retrieved)."""
    return {"score": string_match_all(postprocess_pred(results[0]), list(doc["outputs"]))}


# ---- pairing and judging ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NeedleAnswer:
    doc_id: int
    length: int
    task: str
    score: float
    doc_hash: str
    prompt_hash: str

    @property
    def right(self) -> bool:
        return self.score >= 1.0


def answers_from_samples(samples: Iterable[Mapping[str, Any]], arm: str) -> dict[int, NeedleAnswer]:
    out: dict[int, NeedleAnswer] = {}
    for s in samples:
        try:
            doc = s["doc"]
            out[int(s["doc_id"])] = NeedleAnswer(
                doc_id=int(s["doc_id"]),
                length=int(doc["max_length"]),
                task=str(doc["task"]),
                score=float(s["score"]),
                doc_hash=str(s["doc_hash"]),
                prompt_hash=str(s["prompt_hash"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EvalError(f"{arm}: lm-eval needle sample lacks {exc}") from exc
    return out


def pair_by_length(
    control: Mapping[int, NeedleAnswer], candidate: Mapping[int, NeedleAnswer], expected: int
) -> dict[int, PairedCounts]:
    """Paired counts per context length; both arms must have answered the same prompts."""
    for arm, got in (("control", control), ("candidate", candidate)):
        if len(got) != expected:
            raise EvalError(f"{arm}: lm-eval returned {len(got)} of {expected} needle items")
    outcomes: dict[int, list[tuple[bool, bool]]] = {}
    for doc_id, c in control.items():
        k = candidate.get(doc_id)
        if k is None or k.prompt_hash != c.prompt_hash or k.doc_hash != c.doc_hash:
            raise EvalError(f"needle item {doc_id}: the arms were sent different prompts")
        outcomes.setdefault(c.length, []).append((c.right, k.right))
    return {n: PairedCounts.from_outcomes(pairs) for n, pairs in sorted(outcomes.items())}


@dataclass(frozen=True, slots=True)
class LongContextPlan:
    margin: float = DEFAULT_MARGIN
    confidence: float = 0.95
    fail_confidence: float = DEFAULT_FAIL_CONFIDENCE
    recovery_floor: float = DEFAULT_RECOVERY

    def __post_init__(self) -> None:
        if not (0 < self.margin < 1):
            raise SpecError("--long-context-margin", f"{self.margin} is not in (0, 1)")
        if not (0 < self.recovery_floor <= 1):
            raise SpecError("--recovery-floor", f"{self.recovery_floor} is not in (0, 1]")
        for name in ("confidence", "fail_confidence"):
            if not (0.5 < getattr(self, name) < 1):
                raise SpecError(name, f"{getattr(self, name)} is not in (0.5, 1)")


class BucketBounds(TypedDict):
    lower: float
    lower_confidence: float
    upper: float
    upper_confidence: float
    sided: str
    method: str


class BucketRow(TypedDict):
    """One context-length bucket's judgement, as the summary's `long_context.buckets` holds it."""

    bucket: str
    context_length: int
    verdict: str
    reason: str
    items: int
    control: dict[str, Any]
    candidate: dict[str, Any]
    recovery: float | None
    paired: dict[str, float]
    bounds: BucketBounds
    mcnemar_p_one_sided: float


def judge_bucket(
    length: int, counts: PairedCounts, plan: LongContextPlan, buckets: int
) -> BucketRow:
    """One bucket: paired non-inferiority at `margin` and the recovery floor.

    pass: lower bound of candidate - control > -margin (at `confidence`) and candidate score
    >= recovery_floor * control score. fail: the candidate is shown worse (upper bound < 0 at
    the Bonferroni-adjusted fail confidence, and the exact one-sided McNemar p below its
    alpha) and either below the recovery floor or worse than the margin (upper < -margin).
    Otherwise inconclusive. Requiring every bucket to pass is an intersection-union test, so
    the pass claim needs no adjustment; the fail side is adjusted for the number of buckets.
    """
    fail_alpha = (1.0 - plan.fail_confidence) / max(1, buckets)
    fail_conf = 1.0 - fail_alpha
    control, candidate = counts.control(), counts.candidate()
    recovery = (
        candidate.accuracy / control.accuracy
        if control.accuracy > 0
        else (1.0 if candidate.accuracy == 0 else math.inf)
    )
    lower = lower_confidence_bound(counts, plan.confidence)
    upper = upper_confidence_bound(counts, fail_conf)
    discordant = counts.discordant
    from scipy.stats import binomtest  # imported where used (kvgate.judge.stats says why)

    mcnemar = (
        float(binomtest(counts.control_only, discordant, 0.5, alternative="greater").pvalue)
        if discordant
        else 1.0
    )
    shown_worse = upper < 0 and mcnemar <= fail_alpha
    below_floor = recovery < plan.recovery_floor
    if lower > -plan.margin and not below_floor:
        verdict, reason = Verdict.PASS, "noninferior"
    elif shown_worse and upper < -plan.margin:
        verdict, reason = Verdict.FAIL, "worse_than_margin"
    elif shown_worse and below_floor:
        verdict, reason = Verdict.FAIL, "below_recovery_floor"
    else:
        verdict, reason = Verdict.INCONCLUSIVE, "not_shown"
    return {
        "bucket": str(length),
        "context_length": length,
        "verdict": str(verdict),
        "reason": reason,
        "items": counts.n,
        "control": control.to_dict(),
        "candidate": candidate.to_dict(),
        "recovery": recovery if math.isfinite(recovery) else None,
        "paired": {**counts.to_dict(), "difference": counts.difference},
        "bounds": {
            "lower": lower,
            "lower_confidence": plan.confidence,
            "upper": upper,
            "upper_confidence": fail_conf,
            "sided": "one-sided",
            "method": "tango score; fail side Bonferroni over buckets",
        },
        "mcnemar_p_one_sided": mcnemar,
    }


def judge(
    per_length: Mapping[int, PairedCounts], plan: LongContextPlan
) -> tuple[Verdict, str | None, str | None, list[BucketRow]]:
    """Every bucket judged; the task's verdict is the worst, with the first such bucket."""
    rows = [judge_bucket(n, c, plan, len(per_length)) for n, c in sorted(per_length.items())]
    if not rows:
        raise EvalError("no needle item was judged")
    verdict = worst(Verdict(r["verdict"]) for r in rows)
    first = next(r for r in rows if r["verdict"] == verdict)
    return verdict, first["reason"], first["bucket"], rows
