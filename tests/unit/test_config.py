"""OperatorConfig from the environment: defaults, overrides, errors naming the variable."""

from __future__ import annotations

import pytest

from kvgate.config import DEFAULT_EVAL_IMAGE, OperatorConfig, offline_requested
from kvgate.errors import SpecError


def test_defaults() -> None:
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig()
    assert config.gsm8k_dir is None and config.eval_image == DEFAULT_EVAL_IMAGE
    assert config.hub_offline is False
    assert config.hub_token_secrets is False  # tokenSecretRef is refused unless enabled


def test_hub_token_secrets_are_an_opt_in() -> None:
    assert OperatorConfig.from_env({"KVGATE_HUB_TOKEN_SECRETS": "1"}).hub_token_secrets is True
    assert OperatorConfig.from_env({"KVGATE_HUB_TOKEN_SECRETS": "0"}).hub_token_secrets is False
    with pytest.raises(SpecError, match="KVGATE_HUB_TOKEN_SECRETS"):
        OperatorConfig.from_env({"KVGATE_HUB_TOKEN_SECRETS": "maybe"})


def test_the_load_image_defaults_to_the_eval_image() -> None:
    config = OperatorConfig.from_env({"KVGATE_EVAL_IMAGE": "registry/kvgate:1"})
    assert config.load_image is None and config.load_job_image == "registry/kvgate:1"
    config = OperatorConfig.from_env(
        {"KVGATE_EVAL_IMAGE": "registry/kvgate:1", "KVGATE_LOAD_IMAGE": "registry/load:2"}
    )
    assert config.load_job_image == "registry/load:2"
    with pytest.raises(SpecError, match="KVGATE_LOAD_IMAGE"):
        OperatorConfig.from_env({"KVGATE_LOAD_IMAGE": "img latest"})


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


@pytest.mark.parametrize(
    ("variable", "value", "offline"),
    [
        ("HF_HUB_OFFLINE", "on", True),  # huggingface_hub's own true words: 1, ON, YES, TRUE
        ("HF_HUB_OFFLINE", " TRUE ", True),
        ("TRANSFORMERS_OFFLINE", "1", True),
        ("HF_HUB_OFFLINE", "0", False),
        ("HF_HUB_OFFLINE", "off", False),
    ],
)
def test_the_operator_is_offline_by_the_rule_the_eval_job_uses(
    variable: str, value: str, offline: bool
) -> None:
    # one rule: an operator told offline never reaches the hub while its eval Job stays offline
    environ = {variable: value}
    assert OperatorConfig.from_env(environ).hub_offline is offline is offline_requested(environ)


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
        # nan passes every minimum, inf never ends a scrape
        ({"KVGATE_SCRAPE_TIMEOUT": "nan"}, "KVGATE_SCRAPE_TIMEOUT: 'nan' is not a finite number"),
        ({"KVGATE_SCRAPE_TIMEOUT": "inf"}, "KVGATE_SCRAPE_TIMEOUT: 'inf' is not a finite number"),
        ({"KVGATE_POLL_INTERVAL": "NaN"}, "KVGATE_POLL_INTERVAL: 'NaN' is not a finite number"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as info:
        OperatorConfig.from_env(env)
    assert str(info.value) == message
    assert info.value.field == next(iter(env))


def test_eval_job_settings_and_allowlist_extensions() -> None:
    config = OperatorConfig.from_env(
        {
            "KVGATE_EVAL_IMAGE": "ghcr.io/kvgate/kvgate-eval@sha256:" + "b" * 64,
            "KVGATE_EVAL_SERVICE_ACCOUNT": "kvgate-eval",
            "KVGATE_EVAL_WRITABLE_TMP": "false",
            "KVGATE_EXTRA_ALLOWED_ARGS": "--enforce-eager, --swap_space",
            "KVGATE_EXTRA_ALLOWED_ENV": "KVGATE_SIM_FAULTS,KVGATE_SIM_*",
        }
    )
    assert config.eval_image.endswith("@sha256:" + "b" * 64)
    assert config.eval_service_account == "kvgate-eval"
    assert config.eval_writable_tmp is False
    assert config.allowlist.extra_args == {"--enforce-eager", "--swap-space"}
    assert config.allowlist.env_allowed("vllm", "KVGATE_SIM_LOAD")
    assert not OperatorConfig.from_env({}).allowlist.env_allowed("vllm", "KVGATE_SIM_LOAD")
    assert OperatorConfig.from_env({}).eval_writable_tmp is True
    assert OperatorConfig.from_env({}).eval_service_account is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KVGATE_EXTRA_ALLOWED_ENV": "VLLM_X,LD_PRELOAD"},
            "KVGATE_EXTRA_ALLOWED_ENV: LD_PRELOAD is on the denylist the CRD enforces; "
            "it cannot be allowed",
        ),
        (
            {"KVGATE_EXTRA_ALLOWED_ARGS": "--trust-remote-code"},
            "KVGATE_EXTRA_ALLOWED_ARGS: --trust-remote-code is on the denylist the CRD enforces; "
            "it cannot be allowed",
        ),
        ({"KVGATE_EXTRA_ALLOWED_ARGS": "eager"}, "KVGATE_EXTRA_ALLOWED_ARGS: 'eager' is not a --flag name"),
        ({"KVGATE_EVAL_WRITABLE_TMP": "maybe"}, "KVGATE_EVAL_WRITABLE_TMP: 'maybe' is not a boolean; use true or false"),
        ({"KVGATE_EVAL_SERVICE_ACCOUNT": "Bad_Name"}, "KVGATE_EVAL_SERVICE_ACCOUNT: 'Bad_Name' is not a Kubernetes object name"),
        ({"KVGATE_EVAL_IMAGE": "img latest"}, "KVGATE_EVAL_IMAGE: 'img latest' is not an image reference (repo:tag or repo@sha256:...)"),
    ],
)  # fmt: skip
def test_bad_security_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as info:
        OperatorConfig.from_env(env)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ("", None),
        ("http://prometheus.monitoring:9090", "http://prometheus.monitoring:9090"),
        ("https://thanos.example/prometheus/ ", "https://thanos.example/prometheus"),
    ],
)
def test_prometheus_url(raw: str, url: str | None) -> None:
    assert OperatorConfig.from_env({"KVGATE_PROMETHEUS_URL": raw}).prometheus_url == url


@pytest.mark.parametrize(
    "raw",
    [
        "prometheus:9090",
        "ftp://prometheus:9090",
        "http://user:secret@prometheus:9090",
        "http://prometheus:9090/?query=up",
        "http://" + "a" * 3000,
    ],
)
def test_a_bad_prometheus_url_names_the_variable(raw: str) -> None:
    with pytest.raises(SpecError, match=r"^KVGATE_PROMETHEUS_URL: ") as info:
        OperatorConfig.from_env({"KVGATE_PROMETHEUS_URL": raw})
    assert "secret" not in str(info.value)  # a password in the URL is never echoed
    assert len(str(info.value)) < 200  # a long value is cut
