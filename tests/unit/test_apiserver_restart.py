"""The one reader of a control plane's kube-apiserver container and the one rule for "restarted since the apply"
(managed/apiserver_restart.py), which a config rollout and a ca-rotation both wait on: tables.

An empty container ID is no instance. Config's earlier reader took the first ID even when it was empty, and its
rule took any ID other than the recorded one, "" included, as the restart: both rows marked "config's old" fail on
that behaviour."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.operations.managed.apiserver_restart import RunningAPIServer, restarted, running_apiserver
from ichord.talos.resources import StaticPodStatus

OLD, NEW = "containerd://old", "containerd://new"


def pod(name: str, *container_ids: str, ready: bool = True) -> StaticPodStatus:
    statuses: list[dict[str, Any]] = [{"name": name.split("/")[1]} | ({"containerID": c} if c else {})
                                      for c in container_ids]
    return StaticPodStatus(name, {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                                  "containerStatuses": statuses})


class StaticPods:
    """Talos's StaticPodStatus list, as the client returns it (the wire is tested in test_talos_behaviour.py)."""

    def __init__(self, pods: list[StaticPodStatus]) -> None:
        self.pods = pods
        self.calls = 0

    async def static_pod_statuses(self, endpoint: str) -> list[StaticPodStatus]:
        assert endpoint == "10.5.0.2:50000"
        self.calls += 1
        return self.pods


APISERVER = "kube-system/kube-apiserver-cp-1"
READS = {
    "the running container and the pod's Ready": ([pod(APISERVER, NEW)], RunningAPIServer(NEW, True)),
    "not ready yet": ([pod(APISERVER, NEW, ready=False)], RunningAPIServer(NEW, False)),
    "the other static pods are not kube-apiserver": (
        [pod("kube-system/kube-scheduler-cp-1", "containerd://s"), pod(APISERVER, NEW)], RunningAPIServer(NEW, True)),
    # config's old reader: "" (the first ID, empty)
    "a status without an ID is skipped for the one with it": ([pod(APISERVER, "", NEW)], RunningAPIServer(NEW, True)),
    "no status reports an ID: no instance": ([pod(APISERVER, "", ready=False)], RunningAPIServer("", False)),
    "no container status at all": ([pod(APISERVER)], RunningAPIServer("", True)),
    "no kube-apiserver pod (a worker, or not started)": ([], RunningAPIServer("", False)),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(READS))
async def test_the_container_read(case: str) -> None:
    pods, want = READS[case]
    talos = StaticPods(pods)
    assert await running_apiserver(talos, "10.5.0.2:50000") == want  # type: ignore[arg-type]
    assert talos.calls == 1  # one StaticPodStatus list per read


#: (recorded before the apply, running now, seconds since the apply) -> restarted; given the minute at 60 s.
RULE = {
    "the same container: not yet": ((OLD, OLD, 1.0), False),
    "another container: restarted": ((OLD, NEW, 1.0), True),
    # config's old rule: restarted ("" differs from the recorded ID)
    "no container reported now: waited for, not restarted": ((OLD, "", 1.0), False),
    "none recorded, none now: not restarted": (("", "", 1.0), False),
    "none recorded before the apply: any instance is the new one": (("", NEW, 1.0), True),
    "unchanged for the minute: the apply changed nothing it loads": ((OLD, OLD, 60.0), True),
    "nothing reported for the minute: /readyz decides": ((OLD, "", 60.0), True),
}


@pytest.mark.parametrize("case", list(RULE))
def test_restarted_since_the_apply(case: str) -> None:
    (recorded, running, elapsed), want = RULE[case]
    assert restarted(recorded, running, elapsed=elapsed, unchanged_after=60.0) is want
