"""Drain one Node of the managed cluster through the Eviction API before a step reboots its machine (a config
rollout's reboot roll: docs/decisions.md#config-rollout).

One round per reconcile step, so a step stays short: list the Node's pods (live, ``spec.nodeName``
field selector), leave DaemonSet pods, mirror (static) pods and finished pods alone, refuse pods that no
controller owns (evicting them would lose them), and ask the Eviction API for every other one; a 429 is a
PodDisruptionBudget saying "not yet": wait. The whole drain is timed from the Node annotation
``ichor.maesh.dev/drain-started-at`` (written on the first round that has a pod to evict, before its first
eviction, so the bound survives a restart) and gives up past ``Timing.drain_bound``; the annotation is removed when
the drain ends either way.

A Node with nothing to evict (or a pod no controller owns) is neither annotated nor patched: no eviction was asked,
so there is no drain for a later step to time, and a step killed anywhere in such a round repeats it from the
start. An annotation left by an earlier round (one that evicted, then was killed) is still removed when the drain
ends. The Node is the one the step read (``node_obj``), not read again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ichord.api.names import GROUP
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound, TooManyRequests
from ichord.pki.scrub import SCRUBBER

DRAIN_STARTED_ANNOTATION = f"{GROUP}/drain-started-at"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


class DrainVerdict:
    DONE = "done"
    WAIT = "wait"
    REFUSED = "refused"  # unowned pods, or the bound passed: give up (the caller uncordons)


@dataclass(frozen=True)
class DrainRound:
    verdict: str
    message: str = ""
    evicted: tuple[str, ...] = ()
    blocked: tuple[str, ...] = field(default=())
    #: The round patched the Node (its annotation): a copy read before the round is out of date.
    wrote_node: bool = False


def _ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def skipped(pod: Obj) -> bool:
    """DaemonSet pods (their controller ignores unschedulable), mirror pods (the kubelet's), finished pods."""
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return True
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    return any(o.get("controller") and o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])


def unowned(pod: Obj) -> bool:
    return not any(o.get("controller") for o in (pod.get("metadata") or {}).get("ownerReferences") or [])


def _started_at(node: Obj) -> dt.datetime | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(DRAIN_STARTED_ANNOTATION)
    if not raw:
        return None
    try:
        t = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


async def _annotate(kc: KubeClient, node: str, value: str | None) -> None:
    await kc.raw("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"annotations": {
        DRAIN_STARTED_ANNOTATION: value}}}, content_type=MERGE_PATCH)


async def end_drain(kc: KubeClient, node: str, node_obj: Obj | None = None) -> bool:
    """Forget the drain's start (the next drain of this Node is timed afresh); ``node_obj``: the Node as this step
    read it (read now when None). True when a patch was sent."""
    if node_obj is None:
        try:
            node_obj = await kc.raw("GET", f"/api/v1/nodes/{node}")
        except NotFound:
            return False
    if _started_at(node_obj) is None:
        return False
    await _annotate(kc, node, None)
    return True


async def drain_round(kc: KubeClient, node: str, *, now: dt.datetime, bound: float,
                      node_obj: Obj | None = None) -> DrainRound:
    """One eviction round on ``node`` (``node_obj``: the Node as this step read it; read now when None); KubeErrors
    of the reads propagate (the caller waits and retries)."""
    obj = node_obj if node_obj is not None else await kc.raw("GET", f"/api/v1/nodes/{node}")
    started = _started_at(obj)
    pods = (await kc.raw("GET", "/api/v1/pods", query=[("fieldSelector", f"spec.nodeName={node}")])).get("items") or []
    pods = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node and not skipped(p)]
    orphans = sorted(_ref(p) for p in pods if unowned(p))
    if orphans:
        wrote = await end_drain(kc, node, obj)
        shown = ", ".join(orphans[:5]) + (f" and {len(orphans) - 5} more" if len(orphans) > 5 else "")
        return DrainRound(DrainVerdict.REFUSED,
                          f"Node {node} runs pods that no controller owns ({shown}); evicting them would lose them: "
                          "delete or move them, then resume", wrote_node=wrote)
    if not pods:
        # Nothing to evict: no start to record (a kill anywhere here repeats this round), only an earlier one to end.
        wrote = await end_drain(kc, node, obj)
        return DrainRound(DrainVerdict.DONE, f"Node {node} drained", wrote_node=wrote)
    annotated = started is None
    if started is None:
        # Before the first eviction: a step killed after it still finds when the drain began (its bound).
        started = now
        await _annotate(kc, node, now.astimezone(dt.UTC).isoformat())
    evicted: list[str] = []
    blocked: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue  # on its way out already
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        try:
            await kc.raw("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", body=body)
            evicted.append(_ref(pod))
        except NotFound:
            evicted.append(_ref(pod))  # gone meanwhile
        except TooManyRequests:
            blocked.append(_ref(pod))  # a PodDisruptionBudget: not yet
        except KubeError as exc:
            blocked.append(f"{_ref(pod)} ({SCRUBBER.exception(exc)})")
    spent = (now - started).total_seconds()
    if blocked and spent >= bound:
        await _annotate(kc, node, None)  # annotated: read so, or written above
        shown = ", ".join(blocked[:3]) + (f" and {len(blocked) - 3} more" if len(blocked) > 3 else "")
        return DrainRound(DrainVerdict.REFUSED,
                          f"Node {node} did not drain within {bound:g} s: eviction of {shown} is still refused "
                          "(a PodDisruptionBudget allows no disruption)", tuple(evicted), tuple(blocked),
                          wrote_node=True)
    waiting = f"evicted {len(evicted)} pod(s)" + (f", {len(blocked)} held by a PodDisruptionBudget ("
                                                  f"{', '.join(blocked[:3])})" if blocked else "")
    return DrainRound(DrainVerdict.WAIT, f"draining Node {node}: {waiting}", tuple(evicted), tuple(blocked),
                      wrote_node=annotated)
