"""The TalosCluster's Ready from its machines' (docs/decisions.md#bundle-belongs), decided from what the step holds:
this step's machine results, else the machines as the informer holds them (no request).

    a machine refuses the bundle (BundleMismatch)     -> False/BundleMismatch: the bundle's CA fingerprints and the
                                                         ones the nodes trust, how many machines refuse it
    an approved machine not Ready, for any reason     -> False/MachinesNotReady: "2 of 4 machines not Ready:
      but an operation's planned wait                    demo-w-1 InvalidConfig, demo-cp-2 Unreachable" (a few
                                                         named, then "and N more")
    otherwise                                         -> True/Reconciled

An operation's planned waits (a reboot or kube-apiserver restart it asked for, a rotation or another kind holding
the machines) need nobody, so they do not make the cluster not Ready; a machine not looked at yet counts for
nothing either way. Unapproved machines are not the cluster's until a person approves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.api.names import ReadyReason
from ichord.api.views import ClusterView, MachineView
from ichord.machines.reconciler import MachineResult
from ichord.operations.bundle_source import BundleRead, BundleSourceError
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Target
from ichord.render.trusted_cas import TITLES, BundleCAs, NodeTrust, refusals

#: The TalosCluster's Ready once its spec renders, its bundle is usable and its machines are Ready.
READY = Condition(names.READY, "True", "Reconciled", "the bundle is readable")

#: A machine's Ready reasons that are an operation's planned wait, not something for a person.
PLANNED = frozenset({ReadyReason.REBOOTING, ReadyReason.API_SERVER_RESTARTING, ReadyReason.CA_ROTATION_IN_PROGRESS,
                     ReadyReason.OPERATION_UNDER_WAY})
#: How many machines a message names before "and N more" (a fleet's cluster of hundreds keeps a short message).
NAMED = 3
#: How many refused CAs the cluster's message names with their fingerprints (four would not fit a condition).
NAMED_CAS = 2


@dataclass(frozen=True)
class MachineReady:
    """One approved machine's Ready as the step knows it (status None: never reconciled yet)."""

    name: str
    status: str | None
    reason: str = ""
    trust: NodeTrust | None = None


def of_machine(m: MachineView, result: MachineResult | None) -> MachineReady:
    """``m``'s Ready as this step's ``result`` says it, else as the informer holds it (not due this step)."""
    if result is not None:
        trust = result.fields.get("trustedCAs", m.status.get("trustedCAs"))
        return MachineReady(m.name, result.ready.status, result.ready.reason, NodeTrust.from_status(trust))
    ready = find(m.status.get("conditions"), names.READY)
    if ready is None:
        return MachineReady(m.name, None)
    return MachineReady(m.name, str(ready.get("status")), str(ready.get("reason") or ""),
                        NodeTrust.from_status(m.status.get("trustedCAs")))


def bundle_cas(read: BundleRead, bundle: SecretsBundle) -> BundleCAs:
    """The bundle Secret's CAs compared with the nodes': secrets.yaml's and, during a rotation, rotation.yaml's new
    ones (the nodes may trust only those from Dropping on)."""
    rotation: dict[str, bytes] = {}
    for name in TITLES:
        try:
            crt = read.rotation_ca_certificate(Target(name))
        except BundleSourceError:
            continue  # an unreadable rotation.yaml is the rotation's to report (RotationInvalid)
        if crt is not None:
            rotation[name] = crt
    return BundleCAs.of_bundle(bundle, rotation)


def restore_command(cluster: ClusterView) -> str:
    """The command that puts the saved bundle (``ichord cluster bundle-export``'s default file) back in the Secret."""
    return (f"`kubectl -n {cluster.secret_namespace} create secret generic {cluster.secret_name} "
            f"--from-file=secrets.yaml=$HOME/.ichord/clusters/{cluster.name}/secrets.yaml --dry-run=client -o yaml "
            f"| kubectl apply -f -` (or from wherever you keep the cluster's bundle)")


def _named(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED])
    return shown if len(items) <= NAMED else f"{shown} and {len(items) - NAMED} more"


def _fingerprints(fps: Sequence[str]) -> str:
    return ", ".join(fps) if fps else "none read"


def _mismatch(machines: Sequence[MachineReady], refusing: Sequence[MachineReady], bundle: BundleCAs,
              secret: str, restore: str) -> Condition:
    node_fps: dict[str, list[str]] = {}
    for m in refusing:
        for r in refusals(bundle, m.trust) if m.trust is not None else ():
            node_fps.setdefault(r.name, [])
            node_fps[r.name] += [fp for fp in r.node if fp not in node_fps[r.name]]
    refused = [(name, title) for name, title in TITLES.items() if name in node_fps]
    cas = [f"its {title} {bundle.of(name)[0]} is not among the CAs the nodes trust "
           f"({_fingerprints(node_fps[name][:NAMED])})" for name, title in refused[:NAMED_CAS]]
    if len(refused) > NAMED_CAS:  # the whole bundle another cluster's: the message stays within a condition's bound
        cas.append(f"nor are its {', '.join(title for _, title in refused[NAMED_CAS:])} (each machine's Ready names "
                   "their fingerprints)")
    return Condition(
        names.READY, "False", ReadyReason.BUNDLE_MISMATCH,
        f"the bundle in {secret} is not the one this cluster's nodes trust (another cluster's?): "
        f"{'; '.join(cas) or 'the nodes refuse its CAs'}. {len(refusing)} of {len(machines)} machines refuse it "
        f"({_named([m.name for m in refusing])}); nothing is applied to them. Put the cluster's own bundle back: "
        f"{restore}")


def cluster_ready(machines: Sequence[MachineReady], bundle: BundleCAs, *, namespace: str, secret: str,
                  restore: str) -> Condition:
    """Ready for the cluster in ``namespace`` whose approved machines are ``machines``; ``secret`` names the bundle
    Secret and ``restore`` the command that puts the saved bundle back."""
    looked = [m for m in machines if m.status is not None]
    refusing = [m for m in looked if m.reason == ReadyReason.BUNDLE_MISMATCH]
    if refusing:
        return _mismatch(machines, refusing, bundle, secret, restore)
    not_ready = [m for m in looked if m.status != "True" and m.reason not in PLANNED]
    if not_ready:
        return Condition(
            names.READY, "False", ReadyReason.MACHINES_NOT_READY,
            f"{len(not_ready)} of {len(machines)} machines not Ready: "
            f"{_named([f'{m.name} {m.reason or m.status}' for m in not_ready])}; each machine's Ready says why: "
            f"`kubectl -n {namespace} get tm`")
    return READY
