"""Token-level divergence screen: teacher-forced log-probs of two arms compared by position.

Pure: parsed completions responses in, per-bucket statistics and a flag out. The idea is
llama.cpp's KL-divergence statistics for quantized models: feed the same long documents to
both arms with prompt log-probabilities (vLLM completions `echo: true, max_tokens: 0,
logprobs: k`), and at every position compare the distributions over the next token:

- top-1 agreement: both arms' most likely next token is the same;
- KL(control || candidate) over the returned top-k, with the rest of the vocabulary as one
  tail bucket (see `topk_kl`).

Sending the same requests twice to the control measures the engine's own non-determinism
(the A/A floor, at no extra GPU). FP8 KV error grows with the tokens an attention step reads,
so positions are grouped in buckets of context position; the candidate is flagged when in some
bucket its divergence exceeds the floor by a configured factor.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Final

from kvgate.errors import EvalError, SpecError

SUMMARY_KIND: Final = "kvgate.diverge/summary"
DEFAULT_FACTOR: Final = 10.0
# Floors under the A/A figures, so a bit-identical control (floor 0) does not flag any noise.
DEFAULT_MIN_KL: Final = 1e-3
DEFAULT_MIN_DISAGREEMENT: Final = 0.005
DEFAULT_FIRST_EDGE: Final = 512
_PROB_FLOOR: Final = 1e-12

TopLogprobs = Mapping[str, float]  # one position: token -> log-prob (the returned top-k)


class Verdict(StrEnum):
    PASS = "pass"
    FLAG = "flag"
    ERROR = "error"


EXIT_CODES: Final = {Verdict.PASS: 0, Verdict.FLAG: 1, Verdict.ERROR: 4}


def topk_kl(p: TopLogprobs, q: TopLogprobs) -> float:
    """KL(P || Q) in nats over P's returned tokens plus one tail bucket for the rest.

    P's tokens S carry their probabilities and the tail 1 - sum(S). Q's probability of a token
    in S is its returned value; a token Q did not return is below Q's smallest returned
    probability, and all of them share what Q left unreturned, so each gets the smaller of the
    two. Q's tail is what remains. Both are then distributions over S + tail, so the value is a
    true KL of the coarse-grained distributions (a lower bound on the full-vocabulary KL when
    Q's values are known, 0 exactly when they agree on S).
    """
    if not p:
        raise EvalError("a position with no log-probs cannot be compared")
    p_probs = {t: math.exp(v) for t, v in p.items()}
    q_probs_all = {t: math.exp(v) for t, v in q.items()}
    missing = [t for t in p_probs if t not in q_probs_all]
    impute = 0.0
    if missing:
        left = max(0.0, 1.0 - sum(q_probs_all.values()))
        smallest = min(q_probs_all.values()) if q_probs_all else 1.0
        impute = min(smallest, left / len(missing))
    q_probs = {t: q_probs_all.get(t, impute) for t in p_probs}
    p_tail = max(0.0, 1.0 - sum(p_probs.values()))
    q_tail = max(0.0, 1.0 - sum(q_probs.values()))
    kl = 0.0
    for t, pt in p_probs.items():
        if pt > 0:
            kl += pt * (math.log(pt) - math.log(max(q_probs[t], _PROB_FLOOR)))
    if p_tail > _PROB_FLOOR:
        kl += p_tail * (math.log(p_tail) - math.log(max(q_tail, _PROB_FLOOR)))
    return max(kl, 0.0)


def top1(position: TopLogprobs) -> str:
    """The most likely token (first returned on ties)."""
    return max(position.items(), key=lambda item: item[1])[0]


@dataclass(frozen=True, slots=True)
class DocumentLogprobs:
    """One arm's teacher-forced answer for one document: tokens and top-k per position."""

    tokens: tuple[str, ...]
    top: tuple[TopLogprobs | None, ...]  # None where the engine returns none (position 0)


def parse_completion(body: Any, source: str) -> DocumentLogprobs:
    """The `logprobs` of an OpenAI/vLLM completions response with `echo` (first choice)."""
    try:
        logprobs = body["choices"][0]["logprobs"]
        tokens = logprobs["tokens"]
        top = logprobs["top_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise EvalError(f"{source}: the response has no choices[0].logprobs ({exc})") from exc
    if not isinstance(tokens, list) or not isinstance(top, list) or len(tokens) != len(top):
        raise EvalError(f"{source}: logprobs.tokens and logprobs.top_logprobs do not line up")
    parsed: list[TopLogprobs | None] = []
    for i, entry in enumerate(top):
        if entry is None:
            parsed.append(None)
            continue
        if not isinstance(entry, dict) or not entry:
            raise EvalError(f"{source}: top_logprobs[{i}] is not a token -> log-prob map")
        values: dict[str, float] = {}
        for token, value in entry.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise EvalError(f"{source}: top_logprobs[{i}][{token!r}] is not a number")
            if not math.isfinite(value) or value > 1e-6:
                raise EvalError(f"{source}: top_logprobs[{i}][{token!r}] = {value} is no log-prob")
            values[str(token)] = min(float(value), 0.0)
        parsed.append(values)
    return DocumentLogprobs(tuple(str(t) for t in tokens), tuple(parsed))


def bucket_edges(max_position: int, first: int = DEFAULT_FIRST_EDGE) -> list[int]:
    """0, first, 2*first, 4*first, ... up to and including a bound above `max_position`."""
    if max_position < 1 or first < 1:
        raise SpecError("buckets", "positions and the first edge must be positive")
    edges = [0, first]
    while edges[-1] <= max_position - 1:
        edges.append(edges[-1] * 2)
    return edges


@dataclass(frozen=True, slots=True)
class BucketStats:
    """One comparison (A/A or candidate) in one position bucket [low, high)."""

    low: int
    high: int
    positions: int
    top1_agreement: float | None
    mean_kl: float | None
    p99_kl: float | None
    max_kl: float | None

    @property
    def disagreement(self) -> float | None:
        return None if self.top1_agreement is None else 1.0 - self.top1_agreement

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("low", "high")}


def compare(
    reference: Sequence[DocumentLogprobs],
    other: Sequence[DocumentLogprobs],
    edges: Sequence[int],
) -> list[BucketStats]:
    """Per bucket of position: top-1 agreement and KL(reference || other), over all documents."""
    if len(reference) != len(other):
        raise EvalError(f"{len(reference)} reference documents against {len(other)}")
    agree = [0] * (len(edges) - 1)
    kls: list[list[float]] = [[] for _ in range(len(edges) - 1)]
    for doc, (ref, oth) in enumerate(zip(reference, other, strict=True)):
        if ref.tokens != oth.tokens:
            raise EvalError(
                f"document {doc}: the arms tokenised it differently "
                f"({len(ref.tokens)} vs {len(oth.tokens)} tokens); not the same model?"
            )
        for position, (p, q) in enumerate(zip(ref.top, oth.top, strict=True)):
            if p is None or q is None:
                continue
            b = bisect.bisect_right(edges, position) - 1  # edges increase (`bucket_edges`)
            if not 0 <= b < len(edges) - 1:
                continue
            kls[b].append(topk_kl(p, q))  # first: it refuses a position with no log-probs
            agree[b] += top1(p) == top1(q)
    out = []
    for b, found in enumerate(kls):
        n = len(found)
        ranked = sorted(found)
        out.append(
            BucketStats(
                low=edges[b],
                high=edges[b + 1],
                positions=n,
                top1_agreement=agree[b] / n if n else None,
                mean_kl=sum(found) / n if n else None,
                p99_kl=ranked[min(n - 1, math.ceil(0.99 * n) - 1)] if n else None,
                max_kl=max(found) if n else None,  # each KL is >= 0
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class ScreenSettings:
    factor: float = DEFAULT_FACTOR
    min_kl: float = DEFAULT_MIN_KL
    min_disagreement: float = DEFAULT_MIN_DISAGREEMENT

    def __post_init__(self) -> None:
        if not (self.factor >= 1.0 and math.isfinite(self.factor)):
            raise SpecError("--factor", f"{self.factor} must be a finite number >= 1")
        for name in ("min_kl", "min_disagreement"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise SpecError("--" + name.replace("_", "-"), f"{value} must be positive")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BucketVerdict:
    low: int
    high: int
    floor: BucketStats
    candidate: BucketStats
    kl_limit: float | None
    disagreement_limit: float | None
    flagged: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        ratio = None
        if self.candidate.mean_kl is not None and self.floor.mean_kl is not None:
            ratio = self.candidate.mean_kl / max(self.floor.mean_kl, _PROB_FLOOR)
        return {
            "bucket": f"{self.low}-{self.high}",
            "low": self.low,
            "high": self.high,
            "positions": self.candidate.positions,
            "floor": self.floor.to_dict(),
            "candidate": self.candidate.to_dict(),
            "kl_ratio": ratio,
            "kl_limit": self.kl_limit,
            "disagreement_limit": self.disagreement_limit,
            "flagged": self.flagged,
            "reasons": list(self.reasons),
        }


def screen(
    floor: Sequence[BucketStats], candidate: Sequence[BucketStats], settings: ScreenSettings
) -> tuple[Verdict, list[BucketVerdict]]:
    """Flag a bucket where the candidate's mean KL or top-1 disagreement exceeds `factor`
    times the A/A floor's (each floor at least `min_kl` / `min_disagreement`)."""
    rows: list[BucketVerdict] = []
    for f, c in zip(floor, candidate, strict=True):
        if (f.low, f.high) != (c.low, c.high):
            raise EvalError("floor and candidate buckets differ")
        reasons: list[str] = []
        kl_limit = dis_limit = None
        if f.positions and c.positions:
            assert f.mean_kl is not None and c.mean_kl is not None
            assert f.disagreement is not None and c.disagreement is not None
            kl_limit = settings.factor * max(f.mean_kl, settings.min_kl)
            dis_limit = settings.factor * max(f.disagreement, settings.min_disagreement)
            if c.mean_kl > kl_limit:
                reasons.append("kl_above_floor")
            if c.disagreement > dis_limit:
                reasons.append("top1_disagreement_above_floor")
        rows.append(
            BucketVerdict(c.low, c.high, f, c, kl_limit, dis_limit, bool(reasons), tuple(reasons))
        )
    if not any(r.candidate.positions for r in rows):
        raise EvalError("no position was compared (documents too short?)")
    verdict = Verdict.FLAG if any(r.flagged for r in rows) else Verdict.PASS
    return verdict, rows
