"""`eval` and `diverge` take the URL forms a user types and fail like every other command (the
cases that need `test_eval_cli`'s fake runner are there, under "first-hour-2").

first-hour-2 N2: a base URL (the form `load-job` takes) was posted to as is; the engine's 400
came back after three retries as exit 4. N4: an error summary printed nothing on stderr when
piped. N24: `diverge` gave exit 2 for the missing GSM8K that `eval` gives 4 for.
"""

from __future__ import annotations

import json

import pytest

from kvgate.cli import main
from kvgate.errors import SpecError
from kvgate.evaluation.runner import completions_url


@pytest.mark.parametrize(
    ("typed", "chat", "url"),
    [
        ("http://10.0.0.1:8000", False, "http://10.0.0.1:8000/v1/completions"),
        ("http://10.0.0.1:8000/", False, "http://10.0.0.1:8000/v1/completions"),
        ("http://10.0.0.1:8000/v1", False, "http://10.0.0.1:8000/v1/completions"),
        ("http://10.0.0.1:8000/v1/", False, "http://10.0.0.1:8000/v1/completions"),
        ("http://10.0.0.1:8000/v1/completions", False, "http://10.0.0.1:8000/v1/completions"),
        ("https://h.example/llm/v1/completions", False, "https://h.example/llm/v1/completions"),
        ("http://10.0.0.1:8000", True, "http://10.0.0.1:8000/v1/chat/completions"),
        ("http://10.0.0.1:8000/v1/chat/completions", True,
         "http://10.0.0.1:8000/v1/chat/completions"),
    ],
)  # fmt: skip
def test_a_base_url_gets_the_endpoint(typed: str, chat: bool, url: str) -> None:
    assert completions_url("control", typed, chat=chat) == url


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("http://10.0.0.1:8000/v1/models", "neither a base URL (http://10.0.0.1:8000) nor"),
        ("http://10.0.0.1:8000/metrics", "the completions endpoint (http://10.0.0.1:8000/v1/"),
        ("10.0.0.1:8000", "is not an http(s) URL"),
    ],
)
def test_another_path_is_refused_naming_both_forms(typed: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        completions_url("candidate", typed)
    assert str(caught.value).startswith("--candidate-url: ") and message in str(caught.value)


def test_diverge_without_gsm8k_is_exit_4_like_eval_with_the_same_error_shape(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVGATE_GSM8K_DIR", raising=False)
    code = main(["diverge", "--control-url", "http://127.0.0.1:9",
                 "--candidate-url", "http://127.0.0.1:9"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 4
    summary = json.loads(out.splitlines()[-1])
    assert summary["verdict"] == "error" and summary["error"].startswith("GSM8K dataset: no local")
    (line,) = err.splitlines()
    assert line.startswith("kvgate diverge: error: GSM8K dataset: no local copy")
    assert "--data-dir" in line
