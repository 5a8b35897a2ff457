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

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from ichord.api.views import MachineView
from ichord.pki import pem as _pem
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.rotation import Target
from ichord.pki.targets import in_certificate_order
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
    """Whether ``m`` has a CA view for these targets (workers hold only what is not control-plane-only: Talos's)."""
    return any(m.is_control_plane or not t.description.control_plane_only for t in targets)


async def _talos(talos: TalosClient, address: str, _read: dict[str, Any]) -> dict[str, Any]:
    os_root = await talos.os_root(address)
    return _entry(os_root.issuing_ca, os_root.accepted_cas)


async def _kubernetes_root(talos: TalosClient, address: str, read: dict[str, Any]) -> Any:
    """KubernetesRootSecrets, read once for the Kubernetes and the aggregator CA."""
    if "kubernetes_root" not in read:
        read["kubernetes_root"] = await talos.kubernetes_root(address)
    return read["kubernetes_root"]


async def _kubernetes(talos: TalosClient, address: str, read: dict[str, Any]) -> dict[str, Any]:
    k8s = await _kubernetes_root(talos, address, read)
    return _entry(k8s.issuing_ca, k8s.accepted_cas)


async def _aggregator(talos: TalosClient, address: str, read: dict[str, Any]) -> dict[str, Any]:
    k8s = await _kubernetes_root(talos, address, read)
    return _entry(k8s.aggregator_ca, k8s.accepted_aggregator_cas)


async def _etcd(talos: TalosClient, address: str, _read: dict[str, Any]) -> dict[str, Any]:
    try:
        blocks = _pem.pem_blocks((await talos.etcd_root(address)).ca_bundle)
    except ValueError:
        blocks = []
    return _entry(blocks[0], blocks[1:]) if blocks else {"issuing": "", "trusted": []}


#: Where a node keeps each of ichord's own targets' CAs (the table of the module's docstring); a target registered
#: with a ``node_reader`` (ichord/pki/targets) brings its own.
READERS: dict[Target, Callable[[TalosClient, str, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    Target.TALOS: _talos,
    Target.KUBERNETES: _kubernetes,
    Target.KUBERNETES_AGGREGATOR: _aggregator,
    Target.ETCD: _etcd,
}


async def read_node_cas(talos: TalosClient, m: MachineView, targets: Iterable[Target]) -> dict[str, Any]:
    """The view, one COSI Get per resource; a read that fails raises (the pass's verification relies on it:
    each read is made with the stage's credentials, so it proves them as a Version call would)."""
    chosen = {t.value for t in targets}
    out: dict[str, Any] = {}
    read: dict[str, Any] = {}
    for description in in_certificate_order():  # the order status.certificates shows the CAs in
        if description.name not in chosen or (description.control_plane_only and not m.is_control_plane):
            continue
        reader = description.node_reader or READERS[Target(description.name)]
        out[description.name] = await reader(talos, m.address, read)
    return out
