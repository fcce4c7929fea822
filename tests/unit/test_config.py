"""OperatorConfig from the environment: defaults, overrides, errors naming the variable."""

from __future__ import annotations

import pytest

from kvgate.config import DEFAULT_EVAL_IMAGE, OperatorConfig
from kvgate.errors import SpecError


def test_defaults() -> None:
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig()
    assert config.gsm8k_dir is None and config.eval_image == DEFAULT_EVAL_IMAGE
    assert config.hub_offline is False


def test_environment() -> None:
    config = OperatorConfig.from_env(
        {
            "KVGATE_GSM8K_DIR": "/data/gsm8k",
            "KVGATE_EVAL_IMAGE": "registry/kvgate:1",
            "KVGATE_EVAL_CONCURRENCY": "16",
            "KVGATE_POLL_INTERVAL": "0.5",
            "KVGATE_METRICS_PORT": "0",
            "HF_HUB_OFFLINE": "1",
        }
    )
    assert (config.gsm8k_dir, config.eval_image, config.eval_concurrency) == (
        "/data/gsm8k",
        "registry/kvgate:1",
        16,
    )
    assert (config.poll_interval_s, config.metrics_port, config.hub_offline) == (0.5, 0, True)


def test_flags_override_the_environment() -> None:
    config = OperatorConfig.from_env({"KVGATE_METRICS_PORT": "9000"})
    assert config.with_overrides(metrics_port=9100, poll_interval_s=None).metrics_port == 9100
    assert config.with_overrides(metrics_port=None).metrics_port == 9000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KVGATE_EVAL_CONCURRENCY": "many"}, "KVGATE_EVAL_CONCURRENCY: 'many' is not an integer"),
        ({"KVGATE_EVAL_CONCURRENCY": "0"}, "KVGATE_EVAL_CONCURRENCY: 0 is below the minimum 1"),
        ({"KVGATE_POLL_INTERVAL": "soon"}, "KVGATE_POLL_INTERVAL: 'soon' is not a number"),
        ({"KVGATE_POLL_INTERVAL": "0"}, "KVGATE_POLL_INTERVAL: 0 is below the minimum 0.1"),
        ({"KVGATE_METRICS_PORT": "-1"}, "KVGATE_METRICS_PORT: -1 is below the minimum 0"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as info:
        OperatorConfig.from_env(env)
    assert str(info.value) == message
    assert info.value.field == next(iter(env))
