"""Leader election on a coordination.k8s.io Lease (the kubernetes client's own implementation).

Two kvgate operators watching the same rollouts (two replicas, a second install, a laptop
run) must never act at once: one holds the Lease and runs, the others wait. kopf's peering
is not this: operators of equal priority all freeze. A leader that cannot renew its Lease
exits (crash-only, as controller-runtime does); its pod restarts as a follower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.errors import KubeError

LOG = logging.getLogger("kvgate.leader")


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    namespace: str
    name: str
    lease_duration_s: int = 15
    renew_deadline_s: int = 10
    retry_period_s: int = 2


def lease_name(namespaces: Sequence[str], clusterwide: bool) -> str:
    """One Lease per watch scope: operators that watch the same rollouts meet on it."""
    scope = "cluster" if clusterwide else ",".join(sorted(namespaces))
    return f"kvgate-leader-{hashlib.sha256(scope.encode()).hexdigest()[:10]}"


def wait_for_leadership(settings: LeaseSettings) -> None:
    """Block until this process holds the Lease; renew it in a thread; exit if it is lost."""
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    from kvgate.adapters.kube import load_api_client

    load_api_client()  # loads the default configuration the Lease lock's client uses
    leading = threading.Event()
    me = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def started() -> None:
        LOG.info("acquired Lease %s/%s as %s", settings.namespace, settings.name, me)
        leading.set()

    def stopped() -> None:
        # Another operator may be acting now: stop at once, without cleanup.
        LOG.error("lost Lease %s/%s; exiting", settings.namespace, settings.name)
        logging.shutdown()
        os._exit(1)

    try:
        config = electionconfig.Config(
            LeaseLock(settings.name, settings.namespace, me),
            lease_duration=settings.lease_duration_s,
            renew_deadline=settings.renew_deadline_s,
            retry_period=settings.retry_period_s,
            onstarted_leading=started,
            onstopped_leading=stopped,
        )
    except (ValueError, SystemExit) as exc:
        raise KubeError(f"leader election settings: {exc}") from exc
    LOG.info("waiting for Lease %s/%s as %s", settings.namespace, settings.name, me)
    threading.Thread(
        target=leaderelection.LeaderElection(config).run, name="kvgate-lease", daemon=True
    ).start()
    leading.wait()
