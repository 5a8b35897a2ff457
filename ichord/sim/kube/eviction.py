"""The pods/eviction subresource: honours PodDisruptionBudgets (429 when one would be violated)."""

from __future__ import annotations

import math
from typing import Any

from ichord.sim.kube.resources import JSON
from ichord.sim.kube.status import ApiError, too_many_requests
from ichord.sim.kube.store import Store


def selector_matches(selector: JSON | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector; an empty selector matches everything, a missing one nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_ready(pod: JSON) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _count(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def evict(store: Store, namespace: str, name: str, body: Any) -> JSON:
    pods_rt = store.resolve("", "v1", "pods")
    pod = store.get(pods_rt, namespace, name)
    labels = pod["metadata"].get("labels") or {}
    pdbs = [p for p in store.list(store.resolve("policy", "v1", "poddisruptionbudgets"), namespace)[0]
            if selector_matches(p["spec"].get("selector"), labels)]
    if len(pdbs) > 1:
        raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                       "subresource does not support.")
    if pdbs and pod_ready(pod):
        pdb = pdbs[0]
        matched = [p for p in store.list(pods_rt, namespace)[0]
                   if selector_matches(pdb["spec"].get("selector"), p["metadata"].get("labels") or {})]
        expected, healthy = len(matched), sum(1 for p in matched if pod_ready(p))
        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = _count(spec["minAvailable"], expected)
        else:
            desired = expected - _count(spec.get("maxUnavailable", 0), expected)
        allowed = healthy - desired
        if allowed <= 0:
            raise too_many_requests(
                "Cannot evict pod as it would violate the pod's disruption budget.",
                [{"reason": "DisruptionBudget",
                  "message": f"The disruption budget {pdb['metadata']['name']} needs {desired} healthy pods "
                             f"and has {healthy} currently"}])
    options = (body or {}).get("deleteOptions") if isinstance(body, dict) else None
    store.delete(pods_rt, namespace, name, (options or {}).get("preconditions"))
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
