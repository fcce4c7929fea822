"""On what was a verdict reached, and does it still hold for what runs now?

A verdict is only valid for the engine it tested: FP8 KV behaviour has changed between engine
versions and GPUs. The key names what the verdict was reached on (the image by digest, the
engine and its version, the model and revision, the KV dtype, the attention backend the engine
chose, the GPU product and count, the tested args/env, the eval policy). After the verdict, a
live key that differs in any field it can read makes the verdict stale: the image, its digest,
the GPUs, or a config that is neither the tested one nor the one before the rollout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvgate.reasons import Reason
from kvgate.records.status import RolloutStatus, VerdictKey, fingerprint
from kvgate.spec.rollout import RolloutSpec


def key_of(status: RolloutStatus, spec: RolloutSpec) -> VerdictKey:
    """The key of the verdict this status is reaching (the candidate arm's evidence)."""
    arm = status.arms.get("candidate")
    scan = arm.scan if arm is not None else None
    policy = {
        name: dataclasses.asdict(getattr(spec, name))
        for name in ("scales", "backend", "accuracy", "divergence", "capacity_gain")
    }
    return VerdictKey(
        image=status.evaluated_image,
        image_digest=arm.image_id if arm is not None else None,
        engine=status.engine or (scan.engine if scan is not None else None),
        engine_version=scan.engine_version if scan is not None else None,
        model=status.model,
        revision=spec.model.revision,
        kv_cache_dtype=(scan.kv_cache_dtype if scan is not None else None) or spec.kv_cache_dtype,
        attention_backend=scan.attention_backend if scan is not None else None,
        gpu_product=arm.gpu_product if arm is not None else None,
        gpu_count=arm.gpu_count if arm is not None else None,
        config=fingerprint(status.candidate) if status.candidate else None,
        eval_policy=fingerprint(policy),
    )


def recorded(status: RolloutStatus) -> VerdictKey | None:
    """The key recorded with the verdict in this status (None: none recorded)."""
    return status.verdict.key if status.verdict is not None else None


@dataclass(frozen=True, slots=True)
class LiveKey:
    """What can be read of the key from the live Deployment and its Ready pods, cheaply."""

    image: str | None
    image_digests: frozenset[str]  # of the pods running the tested config
    # Of those pods: their nodes' GPU products and their containers' GPU counts (known ones only)
    gpu_products: frozenset[str] = frozenset()
    gpu_counts: frozenset[int] = frozenset()
    # The Deployment's command/args/env fields that are neither the tested config nor the one
    # before the rollout (promotion.changed_around): the config runs changed around the test
    config_changed: tuple[str, ...] = ()


def _changed(key: VerdictKey, live: LiveKey) -> list[tuple[str, str]]:
    """(field, what changed in words) for each field of `key` the live target no longer matches.

    An unknown on either side (a pod still starting, a node without GPU feature discovery's
    label) is no evidence of change: it never makes a verdict stale, nor a stale one fresh."""
    changed = []
    if key.image and live.image and live.image != key.image:
        changed.append(("image", f"image {key.image} -> {live.image}"))
    digests = sorted(d for d in live.image_digests if d != key.image_digest)
    if key.image_digest and digests:
        changed.append(("imageDigest", f"image digest {key.image_digest} -> {', '.join(digests)}"))
    products = sorted(p for p in live.gpu_products if p != key.gpu_product)
    if key.gpu_product and products:
        changed.append(("gpuProduct", f"GPU {key.gpu_product} -> {', '.join(products)}"))
    counts = sorted(n for n in live.gpu_counts if n != key.gpu_count)
    if key.gpu_count is not None and counts:
        changed.append(("gpuCount", f"GPU count {key.gpu_count} -> {', '.join(map(str, counts))}"))
    if key.config and live.config_changed:
        fields = "/".join(live.config_changed)
        changed.append(("config", f"{fields} of the Deployment changed from the tested config"))
    return changed


def stale_fields(key: VerdictKey, live: LiveKey) -> tuple[str, ...]:
    """The fields of `key` the live target no longer matches (empty: the verdict holds)."""
    return tuple(name for name, _ in _changed(key, live))


def judge(key: VerdictKey, live: LiveKey) -> tuple[bool, Reason, str]:
    """(stale, reason, message) of the Stale condition for what runs now."""
    changed = changes(key, live)
    if changed is None:
        return False, Reason.VERDICT_CURRENT, "what runs is what the verdict was reached on"
    return (
        True,
        Reason.STALE,
        f"the verdict was reached on another engine, GPU or config than runs now "
        f"({changed}); create the rollout again to evaluate what runs",
    )


def changes(key: VerdictKey, live: LiveKey) -> str | None:
    """What of `key` the live target no longer matches, in words (None: the verdict holds)."""
    return "; ".join(words for _, words in _changed(key, live)) or None
