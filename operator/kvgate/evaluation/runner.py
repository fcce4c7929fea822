"""The lm-eval adapter: runs a GSM8K task against one OpenAI-compatible endpoint.

This is the only module that imports lm_eval (lazily, after the offline environment is set).
Every infrastructure fault lm-eval raises (connection refused, timeouts, exhausted retries,
bodies that are not JSON or not a completions response) is mapped to `EvalError`, so the gate
reports `error`, never `fail`. Answers that are well-formed but hold no number are graded wrong
by lm-eval's filters, as they should be.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from kvgate.config import hf_hub_cache, offline_requested
from kvgate.errors import EvalError, SpecError
from kvgate.evaluation.gate import GSM8K_TEST_QUESTIONS
from kvgate.evaluation.records import ArmAnswer, answers_from_samples

# Our task names; the stock `gsm8k` would clash with lm-eval's registry.
TASK_FILES: Final = {"gsm8k": "gsm8k.yaml", "gsm8k_cot": "gsm8k_cot.yaml"}
GSM8K_ENV: Final = "KVGATE_GSM8K_DIR"
HF_DATASET: Final = ("openai/gsm8k", "main")
# The dataset's commit on the Hub: a download never takes whatever `main` is that day, so two
# evals (and a cache filled elsewhere) read the same questions (security-2.md, finding B).
GSM8K_REVISION: Final = "e53f048856ff4f594e959d75785d2c2d37b678ee"
# The Hub dataset's parquet files for the "main" config, fetched (or found in the local HF cache)
# before any arm is contacted; lm-eval then reads them as local files.
HF_FILES: Final = {
    "test": "main/test-00000-of-00001.parquet",
    "train": "main/train-00000-of-00001.parquet",
}
HF_ENDPOINT: Final = "https://huggingface.co"
DATA_NEXT_STEP: Final = (
    f"set {GSM8K_ENV} or pass --data-dir (a directory with GSM8K's test.jsonl and train.jsonl), "
    "or allow Hugging Face Hub access"
)

log = logging.getLogger(__name__)
_DATASET_LOCK = threading.Lock()


def quiet_lm_eval() -> None:
    """lm-eval's noise the eval's output does not need (first-hour-2 #14): its results' git hash
    runs `git describe` in the Job's working directory, which prints "fatal: not a git
    repository" per arm per look; and its progress bars fill a log that is not a terminal."""
    import lm_eval.evaluator

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


@dataclass(frozen=True, slots=True)
class Arm:
    """One endpoint under test."""

    name: str  # "control" or "candidate"
    url: str  # full endpoint URL, e.g. http://10.0.0.5:8000/v1/completions
    model: str  # served model name

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url, "model": self.model}


@dataclass(frozen=True, slots=True)
class HubFiles:
    """The Hub dataset's test and train splits as local parquet files (in the HF cache)."""

    test: Path
    train: Path


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """Everything that must be identical for both arms."""

    task: str = "gsm8k"
    chat: bool = False  # local-chat-completions with the server's chat template
    num_fewshot: int | None = None  # None: the task's own (5 for gsm8k, 8 for gsm8k_cot)
    seed: int = 1234
    concurrency: int = 8
    max_gen_toks: int = 512  # lm-eval's 256 truncates chain-of-thought answers
    max_retries: int = 3  # total attempts per request (tenacity stop_after_attempt)
    timeout: float = 300.0
    data_dir: Path | None = None  # test.jsonl and train.jsonl; None: the Hub dataset
    hub_files: HubFiles | None = None  # the Hub dataset's parquet files, resolved up front

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model_type": self.model_type,
            "num_fewshot": self.num_fewshot,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "max_gen_toks": self.max_gen_toks,
            "max_retries": self.max_retries,
            "timeout": self.timeout,
            "data_dir": None if self.data_dir is None else str(self.data_dir),
            "dataset": self.dataset,
        }

    @property
    def dataset(self) -> str:
        """Where the questions come from, for the summary and messages."""
        if self.data_dir is not None:
            return str(self.data_dir)
        if self.hub_files is not None:
            return f"{HF_DATASET[0]} ({self.hub_files.test.parent.parent})"
        return HF_DATASET[0]

    @property
    def model_type(self) -> str:
        return "local-chat-completions" if self.chat else "local-completions"

    @property
    def task_name(self) -> str:
        return f"kvgate_{self.task}"


def resolve_data_dir(flag: str | None, environ: Mapping[str, str]) -> Path | None:
    """--data-dir, else $KVGATE_GSM8K_DIR, else None (the Hub dataset); checks the files."""
    raw = flag or environ.get(GSM8K_ENV) or None
    if raw is None:
        return None
    field = "--data-dir" if flag else GSM8K_ENV
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise SpecError(field, f"{raw} is not a directory; point it at the GSM8K jsonl files")
    for name in ("test.jsonl", "train.jsonl"):
        if not (path / name).is_file():
            raise SpecError(field, f"{raw} has no {name}")
    return path


def probe_hub(endpoint: str, timeout: float = 5.0) -> str | None:
    """One request to the hub: None when it answers at all, else why it cannot be reached.

    huggingface_hub backs off and retries a hub that is down for tens of seconds; this answers
    in at most `timeout`.
    """
    import httpx

    try:
        httpx.head(f"{endpoint}/api/datasets/{HF_DATASET[0]}", timeout=timeout)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def resolve_hub_dataset(
    environ: Mapping[str, str], probe: Callable[[str], str | None] = probe_hub
) -> HubFiles:
    """The Hub dataset's parquet files from the local HF cache, downloading them unless offline.

    Called once, before any arm is contacted, so a missing dataset is reported as such, in
    seconds, and never as an endpoint failure. Raises EvalError naming the dataset and the fix.
    """
    from huggingface_hub import hf_hub_download

    cache = hf_hub_cache(environ)
    endpoint = (environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")
    token = environ.get("HF_TOKEN") or None

    def fetch(local_only: bool) -> HubFiles:
        paths = {
            split: Path(
                hf_hub_download(
                    HF_DATASET[0],
                    filename,
                    repo_type="dataset",
                    revision=GSM8K_REVISION,
                    cache_dir=cache,
                    local_files_only=local_only,
                    endpoint=endpoint,
                    token=token,
                )
            )
            for split, filename in HF_FILES.items()
        }
        return HubFiles(test=paths["test"], train=paths["train"])

    def missing(why: str) -> EvalError:
        return EvalError(
            f"GSM8K dataset {HF_DATASET[0]}: no local copy ({GSM8K_ENV} and --data-dir unset), "
            f"not in the Hugging Face cache {cache}, and {why}; {DATA_NEXT_STEP}"
        )

    try:
        return fetch(local_only=True)  # the cache first: no network at all
    except Exception:  # any miss (not cached, partial, unreadable) means: fetch it
        pass
    if offline_requested(environ):
        raise missing("HF_HUB_OFFLINE keeps the Hub off")
    unreachable = probe(endpoint)
    if unreachable is not None:
        raise missing(f"the Hub at {endpoint} is unreachable ({unreachable})")
    try:
        return fetch(local_only=False)
    except Exception as exc:  # hub, HTTP and file errors alike: the dataset is not available
        raise missing(
            f"the Hub could not provide it ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def count_test_questions(data_dir: Path | None) -> int:
    """Questions in the test split (1,319 for the Hub dataset)."""
    if data_dir is None:
        return GSM8K_TEST_QUESTIONS
    with (data_dir / "test.jsonl").open("rb") as f:
        return sum(1 for line in f if line.strip())


def write_task_config(settings: EvalSettings, directory: Path) -> Path:
    """Write the pinned task YAML with this run's dataset into `directory` (lm-eval include path)."""
    if settings.task not in TASK_FILES:
        raise SpecError("--task", f"{settings.task!r} is not one of {sorted(TASK_FILES)}")
    text = (resources.files("kvgate.evaluation") / "tasks" / TASK_FILES[settings.task]).read_text(
        encoding="utf-8"
    )
    config = yaml.safe_load(text)
    config["task"] = settings.task_name
    if settings.data_dir is None and settings.hub_files is not None:
        files = {"test": str(settings.hub_files.test)}
        if "training_split" in config or "fewshot_split" in config:
            files["train"] = str(settings.hub_files.train)
        config.update(
            dataset_path="parquet", dataset_name=None, dataset_kwargs={"data_files": files}
        )
    elif settings.data_dir is None:
        config["dataset_path"], config["dataset_name"] = HF_DATASET
        config.pop("dataset_kwargs", None)
    else:
        files = {"test": str(settings.data_dir / "test.jsonl")}
        if "training_split" in config or "fewshot_split" in config:
            files["train"] = str(settings.data_dir / "train.jsonl")
        config.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": files})
    path = directory / f"{settings.task_name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def offline_environment(settings: EvalSettings) -> dict[str, str]:
    """Variables that keep lm-eval and datasets off the network when the data is local."""
    if settings.data_dir is None and settings.hub_files is None:
        return {}
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}


def completions_url(name: str, url: str, *, chat: bool = False) -> str:
    """The arm's completions endpoint from what was typed: a base URL (`http://A:8000`, the
    form `load-job` takes) or `.../v1` gets the path appended; a URL ending in `/completions`
    is kept. Anything else is refused before a request is sent (first-hour-2 N2: a base URL
    was posted to as is, and the engine's 400 came back after three retries as exit 4)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError(f"--{name}-url", f"{url!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    endpoint = "chat/completions" if chat else "completions"
    if path in ("", "/v1"):
        path = f"{path or '/v1'}/{endpoint}"
    elif not path.endswith("/completions"):
        raise SpecError(
            f"--{name}-url",
            f"{url!r} is neither a base URL ({parts.scheme}://{parts.netloc}) nor the "
            f"completions endpoint ({parts.scheme}://{parts.netloc}/v1/{endpoint})",
        )
    return parts._replace(path=path).geturl()


def check_endpoint(name: str, url: str, model: str | None, timeout: float = 10.0) -> Arm:
    """GET {server}/v1/models: the endpoint answers and serves the model name we will send
    (without `model`: the one model it serves); `url` is what `completions_url` returned."""
    parts = urlsplit(url)
    models_url = f"{parts.scheme}://{parts.netloc}/v1/models"
    try:
        with urllib.request.urlopen(models_url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise EvalError(f"{name} endpoint {models_url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EvalError(f"{name} endpoint {models_url} is unreachable: {reason}") from exc
    try:
        served = [str(m["id"]) for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise EvalError(f"{name} endpoint {models_url}: not an OpenAI model list") from exc
    if model is None:
        if len(served) != 1:
            raise EvalError(
                f"{name} endpoint {models_url} serves {served}; pass --model to choose one"
            )
        return Arm(name, url, served[0])
    if served and model not in served:
        raise EvalError(
            f"{name} endpoint {models_url} serves {served}, not {model!r}; "
            f"pass the served model name"
        )
    return Arm(name, url, model)


class MalformedResponseError(ValueError):
    """An HTTP 200 body that is not a completions response (raised inside lm-eval's retry)."""


def _check_completions(outputs: Any, chat: bool) -> None:
    items = outputs if isinstance(outputs, list) else [outputs]
    for out in items:
        choices = out.get("choices") if isinstance(out, dict) else None
        if not isinstance(choices, list) or not choices:
            raise MalformedResponseError(f"response has no choices: {str(out)[:200]}")
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("index"), int):
                raise MalformedResponseError(f"choice without index: {str(choice)[:200]}")
            if chat:
                message = choice.get("message")
                content = message.get("content", "") if isinstance(message, dict) else 0
                if content is not None and not isinstance(content, str):
                    raise MalformedResponseError(f"chat choice without message: {choice!r:.200}")
            elif not isinstance(choice.get("text"), str):
                raise MalformedResponseError(f"choice without text: {str(choice)[:200]}")


def _strict_model_classes() -> tuple[type, type]:
    """lm-eval's API models with response validation (lm-eval would turn some into answers)."""
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    class StrictCompletions(LocalCompletionsAPI):  # type: ignore[misc]  # lm_eval is untyped: its base is Any
        @staticmethod
        def parse_generations(outputs: Any, **kwargs: Any) -> list[str]:
            _check_completions(outputs, chat=False)
            return list(LocalCompletionsAPI.parse_generations(outputs, **kwargs))

    class StrictChatCompletions(LocalChatCompletion):  # type: ignore[misc]  # lm_eval is untyped: its base is Any
        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
            _check_completions(outputs, chat=True)
            return list(super().parse_generations(outputs, **kwargs))

    return StrictCompletions, StrictChatCompletions


def _endpoint_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the endpoint failed', as lm-eval lets them escape."""
    import aiohttp
    import requests
    import tenacity

    return (
        aiohttp.ClientError,
        requests.RequestException,
        tenacity.RetryError,
        asyncio.TimeoutError,
        TimeoutError,
        ConnectionError,
        json.JSONDecodeError,
        MalformedResponseError,
    )


def writable_cache_environment(
    environ: Mapping[str, str],
    scratch: Path,
    can_write: Callable[[Path], bool] = lambda path: os.access(path, os.W_OK),
) -> dict[str, str]:
    """HF_HOME under `scratch` when the default cache cannot be written (read-only home in a Job).

    The datasets json builder writes an Arrow cache even for local files.
    """
    if environ.get("HF_HOME") or environ.get("HF_DATASETS_CACHE"):
        return {}
    base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    probe = base
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if can_write(probe):
        return {}
    return {"HF_HOME": str(scratch / "hf-home")}


class LmEvalTask:
    """One lm-eval task from the files in `include`, on each arm; same settings for both.

    lm-eval may print to stdout; callers that own stdout (the eval command) redirect it.
    """

    def __init__(
        self,
        settings: EvalSettings,
        arms: Sequence[Arm],
        include: Path,
        task_name: str,
        *,
        chat: bool,
        max_gen_toks: int,
        doing: str = "",
    ) -> None:
        from lm_eval.tasks import TaskManager  # after the offline variables are set

        completions, chat_completions = _strict_model_classes()
        self.settings, self.task_name, self.doing = settings, task_name, doing
        # One model and one task manager per arm: the arms may run in parallel threads.
        # Only our YAML is indexed: the ~10k stock task files cost seconds per job.
        self._arms = {
            arm.name: (
                arm,
                (chat_completions if chat else completions)(
                    model=arm.model,
                    base_url=arm.url,
                    tokenizer_backend=None,  # no tokenizer download; the server tokenizes strings
                    tokenized_requests=False,
                    num_concurrent=settings.concurrency,
                    max_retries=settings.max_retries,
                    max_gen_toks=max_gen_toks,
                    timeout=settings.timeout,
                    seed=settings.seed,
                ),
                TaskManager(include_path=str(include), include_defaults=False),
            )
            for arm in arms
        }

    def samples(self, arm_name: str, **options: Any) -> list[Any]:
        """The one lm-eval call: the task on one arm, seeded by the settings, every sample
        logged; the per-sample records. `options` are the task's own `simple_evaluate`
        arguments. An endpoint's failure or the environment's (data files, dataset cache) is
        one EvalError naming the arm (and the task, by `doing`: " on the needle task")."""
        import lm_eval
        from lm_eval.tasks import get_task_dict

        arm, model, task_manager = self._arms[arm_name]
        name, doing, seed = self.task_name, self.doing, self.settings.seed
        quiet_lm_eval()
        try:
            # Build the task (it loads the dataset) one arm at a time: datasets' file listing
            # uses tqdm's thread_map, whose class-level lock races between threads.
            with _DATASET_LOCK:
                task = get_task_dict([name], task_manager)[name]
            result = lm_eval.simple_evaluate(
                model=model,
                tasks=[task],
                task_manager=task_manager,
                log_samples=True,
                bootstrap_iters=0,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
                verbosity="WARNING",
                **options,
            )
        except _endpoint_errors() as exc:
            raise EvalError(
                f"{arm.name} endpoint {arm.url} failed{doing} after {self.settings.max_retries} "
                f"attempts: {type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        except OSError as exc:  # data files, dataset cache: the job's environment, not the arm
            raise EvalError(
                f"{arm.name} arm: lm-eval could not run{doing}: {type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        if not isinstance(result, dict) or name not in result.get("samples", {}):
            raise EvalError(f"{arm.name}: lm-eval returned no samples of {name}")
        return list(result["samples"][name])


class LmEvalRunner(LmEvalTask):
    """Runs chunks of GSM8K doc ids through lm-eval against each arm."""

    def __init__(self, settings: EvalSettings, arms: Sequence[Arm], workdir: Path) -> None:
        os.environ.update(offline_environment(settings))
        os.environ.update(writable_cache_environment(os.environ, workdir))
        write_task_config(settings, workdir)
        s = settings
        super().__init__(s, arms, workdir, s.task_name, chat=s.chat, max_gen_toks=s.max_gen_toks)

    def run(self, arm_name: str, doc_ids: Sequence[int]) -> dict[int, ArmAnswer]:
        """Evaluate `doc_ids` on one arm; returns graded answers by doc id."""
        s = self.settings
        samples = self.samples(
            arm_name,
            num_fewshot=s.num_fewshot,
            samples={s.task_name: list(doc_ids)},
            apply_chat_template=s.chat,
            fewshot_as_multiturn=s.chat,
        )
        return answers_from_samples(samples, arm_name)
