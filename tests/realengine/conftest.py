"""The realengine tier: real vLLM (the CPU build, `make vllmenv`) serving tiny models built
offline (hack/tiny_model.py), under the operator (on the test kubelet) and beside the simulator.

Without .venv-vllm the tier is skipped with a message naming `make vllmenv`; under CI=true that
is an error (as for the control plane's binaries in tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# The e2e helpers (the operator subprocess, manifests, waits) serve this tier's rollouts too.
E2E_DIR = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

from support import Operator  # noqa: E402

import real_vllm  # noqa: E402 - hack/ is put on sys.path by tests/conftest.py

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    if not real_vllm.installed():
        message = f"real vLLM missing at {real_vllm.VLLM_VENV}: run `make vllmenv`"
        if IN_CI:
            pytest.fail(message + " (CI=true: not skipping)", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_qwen3() -> Path:
    """The default tiny Qwen3 (hidden 256, 4 layers, 2 KV heads, head_dim 64; 2,048 bytes of
    BF16 KV a token), in the model cache (hack/tiny_model.cached): not under /tmp, which the
    load Job's pod mounts an emptyDir over."""
    from tiny_model import cached

    return cached("tiny-qwen3", corpus="words")


@pytest.fixture(autouse=True, scope="module")
def no_operator_outlives_its_module() -> Iterator[None]:
    """As tests/e2e/conftest.py: kill any `kvgate run` a module left running."""
    yield
    for log in Operator.reap():
        warnings.warn(
            f"an operator outlived its module and was killed; its log: {log}", stacklevel=1
        )
