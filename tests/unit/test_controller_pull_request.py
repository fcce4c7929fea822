"""promotion.mode pullRequest, the controller against the in-memory cluster and an in-memory
GitHub: the PR carries the tested change, "GitOps" (this test) applies the merged patch, and
kvgate never writes the Deployment; closed is Declined, merged but never applied Stalls, the
token is never shown, and a crash between opening and recording reuses the PR."""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import kopf
import pytest
import yaml
from test_controller import LOG, World
from test_forge_providers import API, REPO, FakeForge

from kvgate.adapters.forge import RestForge, forge_for
from kvgate.config import OperatorConfig
from kvgate.controller import handlers, pullrequest
from kvgate.flow import proposing

TOKEN = "ghp_" + "Z9y8X7w6" * 5
PATH = "apps/vllm/kvgate-fp8.patch.yaml"
PROMOTION: dict[str, Any] = {
    "mode": "pullRequest",
    "pullRequest": {
        "provider": "github",
        "apiUrl": API["github"],
        "repository": REPO,
        "path": PATH,
        "tokenSecretRef": {"name": "forge-token"},
        "applyDeadline": "120s",
    },
}
END = {"Promoted", "RolledBack", "NotNeeded", "Failed", "Declined"}
# The forge and repository the token's Secret is for (a token goes only there).
PINNED = {"kvgate.io/forge-api-url": API["github"], "kvgate.io/forge-repository": REPO}


class PullRequestWorld(World):
    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, enabled: bool = True) -> None:
        super().__init__(monkeypatch, promotion=copy.deepcopy(PROMOTION))
        self.memo.config = OperatorConfig(
            poll_interval_s=1, hub_offline=True, forge_token_secrets=enabled
        )
        self.forge = FakeForge("github")
        self.tokens: list[str] = []
        self.deployment_patches: list[Any] = []
        self.kube.add_secret(
            "forge-token", TOKEN, labels={"kvgate.io/forge-token": "true"}, annotations=PINNED
        )

        def client(provider: str, api_url: str, token: str) -> RestForge:
            self.tokens.append(token)
            transport = httpx.MockTransport(self.forge)
            return forge_for(provider, api_url, token, client=httpx.Client(transport=transport))

        monkeypatch.setattr(pullrequest, "FORGE_FOR", client)
        real_patch = self.kube.patch_deployment

        def patch(namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
            self.deployment_patches.append(ops)
            return real_patch(namespace, name, ops)

        self.kube.patch_deployment = patch  # type: ignore[method-assign]

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.obj.get("status") or {})

    def until(self, done: Callable[[PullRequestWorld], bool], steps: int = 200) -> None:
        for _ in range(steps):
            if done(self):
                return
            delay = self.reconcile()
            self.now += dt.timedelta(seconds=min(delay, 30))
        raise AssertionError(f"not reached after {steps} reconciles: {self.status}")

    def patch_file(self) -> dict[str, Any]:
        branch = self.forge.pulls[0]["head"]
        text = self.forge.files[(branch, PATH)].decode()
        assert text.startswith("# Written by kvgate")
        loaded = yaml.safe_load(text)
        assert isinstance(loaded, dict)
        return loaded

    def gitops_applies(self) -> None:
        """What Argo CD or Flux does with the merged commit: the strategic-merge patch onto the
        Deployment from Git (args replaced whole, env merged by name, the annotation added)."""
        patch = self.patch_file()
        template = patch["spec"]["template"]
        entry = template["spec"]["containers"][0]
        dep = self.kube.objects[("Deployment", "vllm")]
        meta = dep["spec"]["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {}).update(template["metadata"]["annotations"])
        env = {e["name"]: e for e in self.kube.container().get("env") or []}
        for e in entry.get("env") or []:
            env[e["name"]] = {k: v for k, v in e.items() if v is not None}
        self.kube.edit_container("vllm", args=entry["args"], env=list(env.values()))

    def text_shown(self, caplog: pytest.LogCaptureFixture) -> str:
        return json.dumps([self.status, self.events]) + caplog.text


def opened(w: PullRequestWorld) -> bool:
    return w.phase == "PullRequestOpen" and bool((w.status.get("pullRequest") or {}).get("number"))


def test_pass_opens_a_pr_with_the_tested_change_and_gitops_promotes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    assert w.phases[:4] == ["Preflight", "Canary", "Evaluating", "PullRequestOpen"]
    status = w.status
    key = status["verdict"]["key"]["digest"]
    record = status["pullRequest"]
    assert record["number"] == 1 and record["state"] == "open"
    assert record["branch"] == f"kvgate/r-{status['configHash']}"
    assert (record["provider"], record["repository"]) == ("github", REPO)
    assert len(w.forge.pulls) == 1 and w.forge.pulls[0]["base"] == "main"
    assert key in w.forge.pulls[0]["body"] and "| accuracy |" in w.forge.pulls[0]["body"]
    # the file: the full tested args, the changed env, the verdict annotation
    patch = w.patch_file()
    assert patch["metadata"]["name"] == "vllm"
    entry = patch["spec"]["template"]["spec"]["containers"][0]
    wanted = w.candidate()
    assert entry["name"] == "engine" and entry["args"] == wanted["args"]
    assert patch["spec"]["template"]["metadata"]["annotations"] == {"kvgate.io/verdict": key}
    assert w.config_now() == {k: w.original[k] for k in w.config_now()}  # not touched

    # waits for the merge
    for _ in range(3):
        w.reconcile()
        w.now += dt.timedelta(seconds=30)
    assert w.phase == "PullRequestOpen" and len(w.forge.pulls) == 1

    w.forge.pulls[0].update(state="merged", merge_sha="f" * 40)
    w.until(lambda w: w.phase == "PullRequestMerged")
    assert w.status["pullRequest"]["mergeSha"] == "f" * 40
    assert w.status["pullRequest"]["state"] == "merged"
    w.reconcile()
    assert w.phase == "PullRequestMerged" and w.status["reason"] == "WaitingForGitOps"
    assert "does not carry the tested args/env" in w.status["message"]

    w.gitops_applies()
    w.until(lambda w: w.phase in END)
    assert w.phase == "Promoted"
    w.assert_invariant()  # the Deployment runs the candidate
    assert w.deployment_patches == []  # and kvgate never wrote it
    ready = {c["type"]: c["status"] for c in w.status["conditions"]}
    assert ready["Ready"] == "True" and ready["Stalled"] == "False"
    assert "PullRequestMerged" in w.reasons() and "Promoted" in w.reasons()


def test_the_annotation_alone_missing_keeps_it_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    entry = w.patch_file()["spec"]["template"]["spec"]["containers"][0]
    w.forge.pulls[0].update(state="merged", merge_sha="a" * 40)
    w.until(lambda w: w.phase == "PullRequestMerged")
    w.kube.edit_container("vllm", args=entry["args"])  # args applied, annotation not
    w.reconcile()
    assert w.phase == "PullRequestMerged"
    assert "kvgate.io/verdict annotation is absent" in w.status["message"]


def test_closed_unmerged_is_declined_and_the_deployment_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.forge.pulls[0].update(state="closed")
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("Declined", "Declined")
    w.assert_invariant()
    assert w.deployment_patches == []
    conditions = {c["type"]: c for c in w.status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Reconciling"]["status"] == "False"
    assert w.status["pullRequest"]["state"] == "closed"
    assert "Declined" in w.reasons()


def test_merged_but_never_applied_stalls_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.forge.pulls[0].update(state="merged", merge_sha="b" * 40)
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("Failed", "NotApplied")
    stalled = next(c for c in w.status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "NotApplied")
    assert "not applied within 120s" in stalled["message"]
    assert "does not carry the tested args/env" in stalled["message"]
    w.assert_invariant()
    assert w.deployment_patches == []


def test_a_failing_verdict_opens_no_pull_request(monkeypatch: pytest.MonkeyPatch) -> None:
    w = PullRequestWorld(monkeypatch)
    w.kube.canary_crash_log = "Traceback (most recent call last):\nRuntimeError: boom\n"
    w.until(lambda w: w.phase in END)
    assert w.phase == "RolledBack"
    assert w.forge.pulls == [] and w.forge.requests == [] and w.tokens == []
    assert w.deployment_patches == []


def test_a_token_without_access_is_one_clear_error_and_never_shown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    w = PullRequestWorld(monkeypatch)
    w.forge.push = False  # read-only token: GitHub answers 403 to the first write
    w.until(lambda w: w.status.get("consecutiveErrors", 0) >= 1 or w.phase in END)
    message = w.status["message"]
    assert message.startswith("retrying after:")
    assert "may read but not push" in message and REPO in message and "\n" not in message
    assert "Traceback" not in message
    assert w.tokens and TOKEN not in w.text_shown(caplog)
    assert w.forge.pulls == [] and w.deployment_patches == []


def test_a_refused_token_never_reaches_status_events_or_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    w = PullRequestWorld(monkeypatch)
    w.forge.refuse = 401  # the fake echoes the Authorization header back in its error body
    w.until(lambda w: w.status.get("consecutiveErrors", 0) >= 2 or w.phase in END)
    assert "token was refused (HTTP 401" in w.status["message"]
    assert TOKEN not in w.text_shown(caplog)


def test_a_secret_without_the_opt_in_label_fails_before_anything_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.kube.add_secret("forge-token", TOKEN)  # no kvgate.io/forge-token label
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("Failed", "InvalidSpec")
    assert w.status["message"].startswith("spec.promotion.pullRequest.tokenSecretRef: ")
    assert "kvgate.io/forge-token" in w.status["message"]
    canaries = [p for p in w.kube.of_kind("Pod") if "kvgate.io/rollout" in p["metadata"]["labels"]]
    assert canaries == [] and w.tokens == []


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        (None, "apiUrl"),  # a labelled Secret that names no forge
        ({**PINNED, "kvgate.io/forge-api-url": "https://forge.attacker.example/api/v3"}, "apiUrl"),
        ({**PINNED, "kvgate.io/forge-repository": "acme/other"}, "repository"),
        ({"kvgate.io/forge-api-url": API["github"]}, "repository"),
    ],
)
def test_a_token_goes_only_to_the_forge_and_repository_its_secret_names(
    monkeypatch: pytest.MonkeyPatch, annotations: dict[str, str] | None, field: str
) -> None:
    # A rollout author who may not read the Secret must not be able to send its token to a
    # server of theirs (apiUrl) or use it on another repository: the Secret says where it goes.
    w = PullRequestWorld(monkeypatch)
    labels = {"kvgate.io/forge-token": "true"}
    w.kube.add_secret("forge-token", TOKEN, labels=labels, annotations=annotations)
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("Failed", "InvalidSpec")
    message = w.status["message"]
    assert message.startswith("spec.promotion.pullRequest.tokenSecretRef: ")
    assert f"spec.promotion.pullRequest.{field}" in message
    canaries = [p for p in w.kube.of_kind("Pod") if "kvgate.io/rollout" in p["metadata"]["labels"]]
    assert canaries == [] and w.tokens == [] and w.forge.requests == []
    assert TOKEN not in json.dumps(w.status)


def test_a_trailing_slash_of_the_api_url_is_the_same_forge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    pinned = {**PINNED, "kvgate.io/forge-api-url": API["github"] + "/"}
    w.kube.add_secret(
        "forge-token", TOKEN, labels={"kvgate.io/forge-token": "true"}, annotations=pinned
    )
    w.until(lambda w: w.phase in END or w.phase == "PullRequestOpen")
    assert w.phase == "PullRequestOpen", w.status.get("message")


def test_an_operator_without_forge_secrets_refuses_the_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch, enabled=False)
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("Failed", "InvalidSpec")
    assert "forgeTokenSecrets.enabled is off" in w.status["message"]


def test_a_crash_between_opening_and_recording_reuses_the_same_pr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    crashes = _crash_after_opening(monkeypatch)
    w.until(opened)
    assert crashes and w.crashes == 1
    assert len(w.forge.pulls) == 1 and w.forge.commits == 1  # updated nothing, opened one
    assert w.status["pullRequest"]["number"] == 1
    assert w.status["pullRequest"]["openedAt"]
    assert w.deployment_patches == []


def _crash_after_opening(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The forge opens the PR, then the operator dies before recording its number (once)."""
    real = proposing.opened
    crashes: list[int] = []

    def crash_once(*args: Any, **kwargs: Any) -> Any:
        if not crashes:
            crashes.append(1)
            raise fake_crash()
        return real(*args, **kwargs)

    monkeypatch.setattr(proposing, "opened", crash_once)
    return crashes


def _opened_but_unrecorded(monkeypatch: pytest.MonkeyPatch) -> PullRequestWorld:
    """A world where the forge opened PR #1 and the operator died before recording it."""
    w = PullRequestWorld(monkeypatch)
    crashes = _crash_after_opening(monkeypatch)
    w.until(lambda w: bool(crashes))
    assert len(w.forge.pulls) == 1 and w.forge.pulls[0]["state"] == "open"
    recorded = w.status["pullRequest"]
    assert recorded["state"] == "opening" and "number" not in recorded  # the forge has #1
    return w


def test_an_abort_after_a_crash_before_recording_closes_the_unrecorded_pr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = _opened_but_unrecorded(monkeypatch)
    clients = len(w.tokens)
    pr = _abort_then_closed(w)
    assert len(w.tokens) - clients == 1  # one token read for the lookup and the close
    assert w.status["pullRequest"]["number"] == 1  # found by its branch, now on record
    assert w.status["pullRequest"]["branch"] == pr["head"]
    assert ("Normal", "PullRequestClosed", f"closed pull request #1 on {REPO}") in w.events
    assert len(w.forge.pulls) == 1 and w.deployment_patches == []


def test_an_abort_before_the_forge_was_called_closes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the intent is recorded, the forge never reached: the lookup finds nothing, ends clean
    w = PullRequestWorld(monkeypatch)
    w.until(lambda w: w.phase == "PullRequestOpen")
    assert (w.status.get("pullRequest") or {}).get("state") == "opening" and not w.forge.pulls
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "stop"
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("RolledBack", "Aborted")
    assert w.forge.pulls == [] and w.forge.commits == 0
    assert not [r for _, r, _ in w.events if r == "PullRequestClosed"]
    # it did look: the end asked the forge for the branch's open pull requests
    assert any(r.method == "GET" and r.url.path.endswith("/pulls") for r in w.forge.requests)


def test_killed_after_closing_an_unrecorded_pr_ends_once_on_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lookup found #1 and closed it, the status write did not land: the restarted operator
    # finds no open PR of the branch, closes nothing more and records the end once (status
    # keeps the intent without a number: the close's Event died with the operator).
    w = _opened_but_unrecorded(monkeypatch)
    died = _abort_dying_after_the_first_close(monkeypatch, w)
    assert died == [1] and w.forge.pulls[0]["state"] == "closed"
    assert (w.phase, w.status["reason"]) == ("RolledBack", "Aborted")
    assert len(w.forge.pulls[0].get("comments", [])) == 1  # closed once, commented once


def test_deleting_the_rollout_after_a_crash_before_recording_closes_the_pr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = _opened_but_unrecorded(monkeypatch)
    body = kopf.Body(copy.deepcopy(w.obj))
    handlers.cleanup(body=body, meta=body.metadata, memo=w.memo, logger=LOG, retry=0)
    assert w.forge.pulls[0]["state"] == "closed"
    assert w.deployment_patches == []


def _abort_then_closed(w: PullRequestWorld) -> dict[str, Any]:
    """Abort the rollout, run it to its end: RolledBack, the PR closed with kvgate's comment
    and its state on record. The forge's PR."""
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "wrong model"
    w.until(lambda w: w.phase in END)
    assert (w.phase, w.status["reason"]) == ("RolledBack", "Aborted")
    pr = w.forge.pulls[0]
    assert pr["state"] == "closed"
    assert any("kvgate closed this pull request" in c for c in pr.get("comments", []))
    assert w.status["pullRequest"]["state"] == "closed"
    return pr


def _abort_dying_after_the_first_close(
    monkeypatch: pytest.MonkeyPatch, w: PullRequestWorld
) -> list[int]:
    """Abort, and kill the operator right after its first close landed (before the status
    write); run to the end. The numbers the dying close closed."""
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "stop"
    real = RestForge.close_pull_request
    died: list[int] = []

    def close_then_die(forge: RestForge, repo: str, number: int, comment: str) -> Any:
        closed = real(forge, repo, number, comment)
        if not died:
            died.append(number)
            raise fake_crash()
        return closed

    monkeypatch.setattr(RestForge, "close_pull_request", close_then_die)
    w.until(lambda w: w.phase in END)
    return died


def fake_crash() -> BaseException:
    from fake_cluster import Crash

    return Crash()


def test_deleting_the_rollout_after_gitops_applied_it_reverts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.forge.pulls[0].update(state="merged", merge_sha="c" * 40)
    w.until(lambda w: w.phase == "PullRequestMerged")
    w.gitops_applies()
    applied = w.config_now()
    assert "--kv-cache-dtype" in applied["args"]
    body = kopf.Body(copy.deepcopy(w.obj))
    handlers.cleanup(body=body, meta=body.metadata, memo=w.memo, logger=LOG, retry=0)
    assert w.config_now() == applied and w.deployment_patches == []


def test_applied_on_another_image_digest_is_not_promoted(monkeypatch: pytest.MonkeyPatch) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.forge.pulls[0].update(state="merged", merge_sha="d" * 40)
    w.until(lambda w: w.phase == "PullRequestMerged")
    w.kube.registry_epoch += 1  # the tag now names other content: the new pods pull it
    w.gitops_applies()
    w.reconcile()
    assert w.phase == "PullRequestMerged"
    assert "another engine, GPU or config than the verdict tested" in w.status["message"]
    assert "image digest" in w.status["message"]


def test_an_abort_while_the_pr_is_open_closes_it_with_a_comment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An aborted rollout no longer stands behind its pull request: left open, anyone could
    # merge a change the SRE stopped, and the GitOps tool would apply it unwatched.
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    _abort_then_closed(w)
    assert "closing pull request #1" in w.status["message"]
    assert ("Normal", "PullRequestClosed", f"closed pull request #1 on {REPO}") in w.events
    assert w.deployment_patches == []


def _opened_and_recorded(monkeypatch: pytest.MonkeyPatch) -> PullRequestWorld:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    return w


# How the rollout knows its open pull request: by its recorded number, or only by its branch
# (the operator died between opening it and recording it).
KNOWN_BY = {"number": _opened_and_recorded, "branch": _opened_but_unrecorded}


@pytest.mark.parametrize("known_by", sorted(KNOWN_BY))
def test_a_forge_failing_the_close_holds_the_end_until_it_is_closed(
    monkeypatch: pytest.MonkeyPatch, known_by: str
) -> None:
    w = KNOWN_BY[known_by](monkeypatch)
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "stop"
    w.forge.refuse = 502
    for _ in range(3):
        w.reconcile()
    assert w.phase == "PullRequestOpen" and w.status.get("consecutiveErrors", 0) >= 1
    assert w.forge.pulls[0]["state"] == "open"
    w.forge.refuse = None
    w.until(lambda w: w.phase in END)
    assert w.phase == "RolledBack" and w.forge.pulls[0]["state"] == "closed"
    assert w.status["pullRequest"]["number"] == 1


def test_a_pr_merged_before_the_close_is_said_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.obj["metadata"].setdefault("annotations", {})["kvgate.io/abort"] = "stop"
    real = FakeForge.__call__

    def merge_first(forge: FakeForge, request: httpx.Request) -> httpx.Response:
        # someone merges it between the abort and kvgate's close
        forge.pulls[0].update(state="merged", merge_sha="e" * 40)
        return real(forge, request)

    monkeypatch.setattr(FakeForge, "__call__", merge_first)
    w.until(lambda w: w.phase in END)
    assert w.phase == "RolledBack"
    assert w.status["pullRequest"]["state"] == "merged"
    assert w.status["pullRequest"]["mergeSha"] == "e" * 40
    warnings = [m for t, r, m in w.events if t == "Warning" and r == "PullRequestMerged"]
    assert warnings and "revert it there" in warnings[0] and "e" * 40 in warnings[0]


def test_deleting_the_rollout_while_its_pr_is_open_closes_the_pr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    body = kopf.Body(copy.deepcopy(w.obj))
    handlers.cleanup(body=body, meta=body.metadata, memo=w.memo, logger=LOG, retry=0)
    assert w.forge.pulls[0]["state"] == "closed"
    assert w.deployment_patches == []


def test_a_delete_that_cannot_close_the_pr_is_retried_then_let_go_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = PullRequestWorld(monkeypatch)
    w.until(opened)
    w.forge.refuse = 503
    body = kopf.Body(copy.deepcopy(w.obj))
    with pytest.raises(kopf.TemporaryError):
        handlers.cleanup(body=body, meta=body.metadata, memo=w.memo, logger=LOG, retry=0)
    limit = w.memo.config.error_limit
    handlers.cleanup(body=body, meta=body.metadata, memo=w.memo, logger=LOG, retry=limit)
    warnings = [m for t, r, m in w.events if t == "Warning" and r == "ReconcileError"]
    assert warnings and "close it by hand" in warnings[-1] and TOKEN not in warnings[-1]


def test_an_operator_killed_after_the_close_landed_ends_the_same_on_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The close went through, the status write did not: the restarted operator closes again
    # (a no-op on a closed PR) and records the end once.
    w = _opened_and_recorded(monkeypatch)
    crashes = _abort_dying_after_the_first_close(monkeypatch, w)
    assert crashes and w.crashes == 1
    assert (w.phase, w.status["reason"]) == ("RolledBack", "Aborted")
    assert w.forge.pulls[0]["state"] == "closed" and w.status["pullRequest"]["state"] == "closed"
    closed_events = [m for t, r, m in w.events if r == "PullRequestClosed"]
    assert len(closed_events) == 1  # the first close's Event died with the operator
    assert len(w.forge.pulls[0].get("comments", [])) == 1
