"""The rules the pod model (clientpods.py) follows: the known in-cluster clients and how each reacts to an
API server whose CA it does not hold, taints and tolerations, Node readiness, PEM bundles."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ichord.pki import pem as _pem
from ichord.sim.kube.resources import JSON

ROOT_CA = "kube-root-ca.crt"
CILIUM_TAINT = {"key": "node.cilium.io/agent-not-ready", "effect": "NoSchedule"}

#: Called with (kind, data) for every recorded event (the combined environment puts them in its history).
Recorder = Callable[[str, dict[str, Any]], object]


@dataclass(frozen=True)
class ClientKind:
    """How one known in-cluster client reacts to an API server whose CA it does not hold."""

    role: str  # cni | proxy | dns | operator
    #: Its readiness probe needs the API (cilium): x509-failing makes it NotReady.
    x509_not_ready: bool = False
    #: An agent that is not Ready taints its Node (cilium's agent-not-ready taint).
    taints_node: bool = False
    #: client-go re-reads the refreshed projected ca.crt (kube-proxy recovered on hardware).
    rereads_ca: bool = False


#: (plural, name) in kube-system -> kind. The names ichord restarts (clients.py) and the restore checks.
CLIENTS: dict[tuple[str, str], ClientKind] = {
    ("daemonsets", "kube-flannel"): ClientKind("cni"),
    ("daemonsets", "cilium"): ClientKind("cni", x509_not_ready=True, taints_node=True),
    ("deployments", "cilium-operator"): ClientKind("operator", x509_not_ready=True),
    ("daemonsets", "kube-proxy"): ClientKind("proxy", rereads_ca=True),
    ("deployments", "coredns"): ClientKind("dns"),
}
CLIENT_NAMESPACE = "kube-system"


def template_hash(template: JSON) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def pem_blocks(text: str | bytes) -> frozenset[bytes]:
    """The blocks of a PEM bundle as a set (a pod trusts a set of CAs; order and repeats do not matter)."""
    return frozenset(_pem.pem_blocks(text.encode() if isinstance(text, str) else text))


def tolerates(tolerations: list[JSON], taint: JSON) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and not t.get("key"):
            return True
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_ready(node: JSON) -> bool:
    """Ready per its condition; a Node nothing ever posted a condition for counts as Ready (bare test Nodes)."""
    conds = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return not conds or conds[-1].get("status") == "True"
