"""e2e fixtures beside tests/conftest.py's `cluster` and `namespace`."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from flux import flux_fixture, gitea_fixture
from support import Operator

# The loopback Gitea and Flux's controllers (tests/e2e/flux.py), for every module that asks.
__all__ = ["flux_fixture", "gitea_fixture"]


@pytest.fixture(autouse=True, scope="module")
def no_operator_outlives_its_module() -> Iterator[None]:
    """Kill any `kvgate run` a module left running (a teardown that raised before its stop).

    Every e2e operator runs with -A and takes the one cluster-scope Lease: one left running
    keeps each later module's operator a follower that never serves (CI lost 13 tests to one).
    """
    yield
    for log in Operator.reap():
        warnings.warn(
            f"an operator outlived its module and was killed; its log: {log}", stacklevel=1
        )
