"""The per-node CA view in ``status.machines[].cas`` (issue 17): for each rotated target, the fingerprint of the
CA the node signs with and of every CA it trusts, read from the node's own secrets resources (never from
ichord's plan), so the operator sees who is on which CA; abandon and DeletionHeld messages refer to it.

    talos                  OSRootSecrets: issuingCA, acceptedCAs                      every machine
    kubernetes             KubernetesRootSecrets: issuingCA, acceptedCAs              control planes
    kubernetes-aggregator  KubernetesRootSecrets: aggregatorCA, acceptedAggregatorCAs control planes
    etcd                   EtcdRootSecrets: the cluster.etcd.ca bundle, first signs   control planes

Only certificates are kept (fingerprints). The view is read by the stage's verification (passes.verify_pass), whose
reads it doubles as; it informs, it never decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ichord.api.views import MachineView
from ichord.pki import pem as _pem
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.rotation import Target
from ichord.talos.client import TalosClient


def _entry(issuing: bytes, accepted: Sequence[bytes]) -> dict[str, Any]:
    trusted: list[str] = []
    for pem in (issuing, *accepted):
        for block in _pem.pem_blocks(pem) if pem.strip() else []:
            fp = certificate_fingerprint(block)
            if fp not in trusted:
                trusted.append(fp)
    return {"issuing": trusted[0] if issuing.strip() else "", "trusted": trusted}


def reads(m: MachineView, targets: Iterable[Target]) -> bool:
    """Whether ``m`` has a CA view for these targets (workers hold only the Talos CA's)."""
    chosen = set(targets)
    return Target.TALOS in chosen or (m.is_control_plane and bool(chosen & _CONTROL_PLANE_TARGETS))


_CONTROL_PLANE_TARGETS = frozenset({Target.KUBERNETES, Target.KUBERNETES_AGGREGATOR, Target.ETCD})


async def read_node_cas(talos: TalosClient, m: MachineView, targets: Iterable[Target]) -> dict[str, Any]:
    """The view, one COSI Get per resource; a read that fails raises (the pass's verification relies on it:
    each read is made with the stage's credentials, so it proves them as a Version call would)."""
    chosen = set(targets)
    out: dict[str, Any] = {}
    if Target.TALOS in chosen:
        os_root = await talos.os_root(m.address)
        out[Target.TALOS.value] = _entry(os_root.issuing_ca, os_root.accepted_cas)
    if not m.is_control_plane:
        return out
    if chosen & {Target.KUBERNETES, Target.KUBERNETES_AGGREGATOR}:
        k8s = await talos.kubernetes_root(m.address)
        if Target.KUBERNETES in chosen:
            out[Target.KUBERNETES.value] = _entry(k8s.issuing_ca, k8s.accepted_cas)
        if Target.KUBERNETES_AGGREGATOR in chosen:
            out[Target.KUBERNETES_AGGREGATOR.value] = _entry(k8s.aggregator_ca, k8s.accepted_aggregator_cas)
    if Target.ETCD in chosen:
        try:
            blocks = _pem.pem_blocks((await talos.etcd_root(m.address)).ca_bundle)
        except ValueError:
            blocks = []
        out[Target.ETCD.value] = _entry(blocks[0], blocks[1:]) if blocks else {"issuing": "", "trusted": []}
    return out
