"""Has a control plane's kube-apiserver restarted since an apply? The one reader of its container, and the one rule
(docs/decisions.md#apiserver-restart; docs/decisions.md#ca-rotation-passes point 3).

Before an apply that restarts kube-apiserver, a step records the container the node runs (a config rollout in
``status.apiServerRestart``, a rotation in ``status.caRotation.apiServerInstances``); after it, the node's
kube-apiserver counts as restarted once another container runs, or once ``unchanged_after`` seconds passed (the
apply changed nothing it loads). Then the caller asks the node's own /readyz (readyz.py).

The container is the first ID the kube-apiserver static pod's status reports. An empty ID is no instance: the
container is being created, or Talos reports none. It is never recorded as the instance that runs, and a node that
reports none is waited for, never taken as restarted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ichord.talos.client import TalosClient

#: Talos names the static pod status ``kube-system/kube-apiserver-<node name>``; a control plane runs one.
APISERVER_POD_PREFIX = "kube-system/kube-apiserver-"


@dataclass(frozen=True)
class RunningAPIServer:
    """The node's kube-apiserver as Talos's StaticPodStatus reports it."""

    container_id: str  # "" when no container of the pod reports an ID (no instance runs)
    ready: bool  # the static pod's Ready condition (the kubelet's view; /readyz is the node's own)


async def running_apiserver(talos: TalosClient, endpoint: str) -> RunningAPIServer:
    """One StaticPodStatus list of ``endpoint`` (TalosErrors propagate: the caller waits)."""
    for pod in await talos.static_pod_statuses(endpoint):
        if pod.id.startswith(APISERVER_POD_PREFIX):
            return RunningAPIServer(next((c for c in pod.container_ids if c), ""), pod.ready)
    return RunningAPIServer("", False)


def restarted(recorded: str, running: str, *, elapsed: float, unchanged_after: float) -> bool:
    """kube-apiserver counts as restarted since the apply that recorded ``recorded``: it runs another instance, or
    ``unchanged_after`` seconds passed since the apply. An empty ``running`` is no instance: not a restart (whatever
    was recorded). An empty ``recorded`` (none ran before the apply) makes any instance the new one."""
    if elapsed >= unchanged_after:
        return True
    return running not in ("", recorded)
