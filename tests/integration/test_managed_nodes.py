"""A managed Node turning Ready, or reporting a new boot, wakes the cluster's actor (watchers/managed_nodes.py);
a cordon, a label or a Node seen for the first time does not. On the real wire: the Kubernetes simulator's watch."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ichord.kube.client import KubeClient
from ichord.settings import Timing
from ichord.watchers.informer import WatchEvent
from ichord.watchers.managed_nodes import NODE, NodeWatch

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def _node(name: str, ready: bool, boot: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "nodeInfo": {"bootID": boot}}}


async def test_a_node_back_wakes_the_actor_and_nothing_else_does(kube: KubeClient) -> None:
    await kube.raw("POST", "/api/v1/nodes", body=_node("w1", True, "boot-a"))
    woken: list[tuple[tuple[str, str], str]] = []
    watch = NodeWatch(kube, lambda obj, reason: woken.append((obj, reason)), Timing())
    seen: list[anyio.Event] = []

    def saw(_event: WatchEvent) -> None:  # after NodeWatch's own handler: it has decided on the change by now
        if seen:
            seen.pop(0).set()

    watch.informer.add_handler(saw)

    async def change(body: dict[str, Any], status: bool = True) -> None:
        seen.append(anyio.Event())
        path = "/api/v1/nodes/w1" + ("/status" if status else "")
        await kube.raw("PATCH", path, body=body, content_type="application/merge-patch+json")
        with anyio.fail_after(5):
            await seen[-1].wait()

    try:
        await watch.informer.wait_synced()
        assert woken == []  # first seen: nothing came back
        await change({"spec": {"unschedulable": True}}, status=False)  # cordoned
        await change({"status": _node("w1", False, "boot-a")["status"]})  # going down
        assert woken == []
        await change({"status": _node("w1", False, "boot-b")["status"]})  # answers on a new boot, not Ready yet
        assert woken == [((NODE, "w1"), "NodeReturned")]
        await change({"status": _node("w1", True, "boot-b")["status"]})  # Ready on it
        assert woken == [((NODE, "w1"), "NodeReturned")] * 2
    finally:
        await watch.close()
