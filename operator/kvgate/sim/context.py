"""The FP8 KV cache's error as a function of the number of cached tokens, and prompt log-probs.

FP8 KV error is not spread evenly: it grows with the tokens an attention step reads. The
simulator models it as an error level e(t) in [0, 1] at t cached tokens:

- `KVGATE_SIM_FP8_CONTEXT` gives a curve of `tokens:level` points (piecewise linear in
  log2(tokens), flat beyond the end points), e.g. `4096:0,32768:0.02,131072:0.08`;
- the `long-context-collapse=T` fault (in `KVGATE_SIM_FAULTS`) sets e(t) = 1 for t >= T, the
  shape of the Hopper FP8 kernel bug that took 128k needle accuracy from 91% to 13% while
  short prompts were fine.

Both apply to the FP8 arm only (a BF16 cache has e = 0). e(t) is the share of right answers
turned wrong at that context (on top of `KVGATE_SIM_FP8_LOSS`), and it scales the FP8 arm's
logit error: at position t every logit moves by a deterministic N(0, s(t)) draw with
s(t) = `KVGATE_SIM_FP8_LOGIT_NOISE` + e(t) * COLLAPSE_LOGIT_NOISE.

Log-probabilities are a deterministic function of the seed and the last few tokens, the same
on every pod; `KVGATE_SIM_LOGPROB_JITTER` adds fresh N(0, jitter) noise to every logit of every
request, the engine's own run-to-run non-determinism (batch shapes, reduction order), so two
identical requests to one pod agree up to that floor.
"""

from __future__ import annotations

import hashlib
import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

COLLAPSE_LOGIT_NOISE = 4.0  # logit std at e = 1: the distribution is mostly noise
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
_ALTERNATIVES = 20  # tokens scored besides the actual one, so any k <= 20 is a prefix
_TAIL_LOGIT = 1.0  # the rest of the vocabulary, as one pseudo-token
_VOCAB = (
    " the", " a", " of", " and", " to", " in", " is", " was", " for", " on", " that", " with",
    " it", " as", " at", " by", " from", " this", " be", " are", " or", " an", " had", " not",
    " but", " they", " he", " she", " we", " you", ",", ".", "\n", " (", ")", ":", " one",
    " two", " more", " then", " so", " each", " all", " there", " which", " their", " has",
    " have", " were", " after", " before", " over", " into", " than", " some", " only",
)  # fmt: skip


class CurveError(ValueError):
    """A context curve that cannot be read; the message says why."""


@dataclass(frozen=True)
class ContextCurve:
    """Error level e(t) at t cached tokens: piecewise linear in log2(t)."""

    points: tuple[tuple[int, float], ...] = ()

    @classmethod
    def parse(cls, raw: str) -> ContextCurve:
        """`4096:0,16384:0.01,131072:0.05` (tokens:level, levels in [0, 1])."""
        points: dict[int, float] = {}
        for item in raw.split(","):
            item = item.strip()
            if not item:
                continue
            tokens_text, sep, level_text = item.partition(":")
            if not sep:
                raise CurveError(f"{item!r} is not tokens:level")
            try:
                tokens, level = int(tokens_text), float(level_text)
            except ValueError:
                raise CurveError(f"{item!r} is not tokens:level") from None
            if tokens < 1 or not (0.0 <= level <= 1.0):
                raise CurveError(f"{item!r}: tokens must be >= 1 and the level in [0, 1]")
            points[tokens] = level
        return cls(tuple(sorted(points.items())))

    def level(self, tokens: int) -> float:
        if not self.points:
            return 0.0
        if tokens <= self.points[0][0]:
            return self.points[0][1]
        if tokens >= self.points[-1][0]:
            return self.points[-1][1]
        x = math.log2(tokens)
        for (t0, v0), (t1, v1) in zip(self.points, self.points[1:], strict=False):
            if t0 <= tokens <= t1:
                x0, x1 = math.log2(t0), math.log2(t1)
                return v0 + (v1 - v0) * (x - x0) / (x1 - x0)
        return self.points[-1][1]  # pragma: no cover - the loop always finds the segment


@dataclass(frozen=True)
class ContextModel:
    """One arm's context behaviour: error level, answer loss and log-probabilities."""

    fp8: bool
    curve: ContextCurve = field(default_factory=ContextCurve)
    collapse_at: int | None = None  # long-context-collapse=T: e = 1 from T cached tokens on
    fp8_logit_noise: float = 0.03
    jitter: float = 0.02
    seed: str = "kvgate"

    def error(self, tokens: int) -> float:
        if not self.fp8:
            return 0.0
        if self.collapse_at is not None and tokens >= self.collapse_at:
            return 1.0
        return self.curve.level(tokens)

    def loss(self, base_loss: float, tokens: int) -> float:
        """Share of right answers turned wrong at `tokens` of context (base and context)."""
        return 1.0 - (1.0 - base_loss) * (1.0 - self.error(tokens))

    def logit_noise(self, tokens: int) -> float:
        if not self.fp8:
            return 0.0
        return self.fp8_logit_noise + self.error(tokens) * COLLAPSE_LOGIT_NOISE

    def sequence_logprobs(
        self, pieces: Sequence[str], start: int = 0, rng: random.Random | None = None
    ) -> list[TokenLogprobs | None]:
        """Log-probs of `pieces[start:]` given what precedes each; None for position 0."""
        rng = rng if rng is not None else random.Random()  # fresh per request: the jitter
        out: list[TokenLogprobs | None] = []
        for t in range(start, len(pieces)):
            if t == 0:
                out.append(None)  # no distribution predicts the first token
                continue
            context = pieces[max(0, t - 3) : t]
            out.append(self._position(t, context, pieces[t], rng))
        return out

    def _position(
        self, t: int, context: Sequence[str], actual: str, rng: random.Random
    ) -> TokenLogprobs:
        base = random.Random(_seed_int(self.seed, "lp", *context, actual))
        alternatives: list[str] = []
        offset = int(base.random() * len(_VOCAB))
        for i in range(len(_VOCAB)):
            word = _VOCAB[(offset + 7 * i) % len(_VOCAB)]
            if word != actual and word not in alternatives:
                alternatives.append(word)
            if len(alternatives) == _ALTERNATIVES:
                break
        tokens = [actual, *alternatives]
        # The actual token is usually, not always, the most likely one (as in real text).
        logits = [2.0 + 4.0 * base.random()]
        logits += [1.0 + 4.5 * base.random() - 0.25 * i for i in range(len(alternatives))]
        sigma = self.logit_noise(t)
        if sigma > 0:
            fp8 = random.Random(_seed_int(self.seed, "fp8", str(t), actual))
            logits = [x + fp8.gauss(0.0, sigma) for x in logits]
        if self.jitter > 0:
            logits = [x + rng.gauss(0.0, self.jitter) for x in logits]
        top = max(*logits, _TAIL_LOGIT)
        lse = top + math.log(sum(math.exp(x - top) for x in logits) + math.exp(_TAIL_LOGIT - top))
        logprobs = [x - lse for x in logits]
        order = sorted(range(len(tokens)), key=lambda i: -logprobs[i])
        return TokenLogprobs(
            token=actual,
            logprob=logprobs[0],
            rank=order.index(0) + 1,
            top=tuple((tokens[i], logprobs[i]) for i in order),
        )


@dataclass(frozen=True)
class TokenLogprobs:
    """One position: the actual token's log-prob and rank, and the scored tokens by rank."""

    token: str
    logprob: float
    rank: int
    top: tuple[tuple[str, float], ...]

    def top_k(self, k: int) -> dict[str, float]:
        """vLLM's `top_logprobs` entry: the actual token first, then the k most likely."""
        entries = {self.token: self.logprob}
        for token, logprob in self.top[:k]:
            entries.setdefault(token, logprob)
        return entries

    def prompt_entry(self, k: int) -> dict[str, dict[str, object]]:
        """vLLM's `prompt_logprobs` entry: {token_id: {logprob, rank, decoded_token}}."""
        entries: dict[str, dict[str, object]] = {
            str(token_id(self.token)): {
                "logprob": self.logprob,
                "rank": self.rank,
                "decoded_token": self.token,
            }
        }
        for rank, (token, logprob) in enumerate(self.top[:k], start=1):
            entries.setdefault(
                str(token_id(token)), {"logprob": logprob, "rank": rank, "decoded_token": token}
            )
        return entries


def token_id(piece: str) -> int:
    """A stable id for a piece (the simulator has no vocabulary file)."""
    return 100 + zlib.crc32(piece.encode()) % 151_000


def _seed_int(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest())
