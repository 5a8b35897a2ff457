"""The ca-rotation as data: targets, the stage sequence, the plan, the hand-off token, the dial per stage.

Pure functions only (table-tested): nothing here reads the API or a node.

    stage               next                       verified by
    ""                  Accepting                  preflight + rotation.yaml saved
    Accepting           AwaitingCredentials*       a later pass: every machine dialled, every Node Ready
    AwaitingCredentials Issuing                    the hand-off annotation equals the token
    Issuing             Dropping                   the pass, then kube-root-ca.crt + caClientSettleDelay
    Dropping            Finalizing                 the pass, then the one Secret update
    Finalizing          Done                       replaced bundle verified, Nodes settled, clients restarted

    * Issuing when neither talos nor kubernetes is a target (docs/decisions.md#credentials-handoff).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.api.carotation import Stage
from ichord.api.max_unavailable import WorkerBound
from ichord.contract import VersionContract
from ichord.errors import IchordError
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation, RotationError, Target, parse_targets, target_order
from ichord.render.stages import StageRenderError, check_targets
from ichord.talos.dial import DialBundle

#: Targets this executor rotates (docs/decisions.md#ca-rotation-passes): every registered one (``target_order()``,
#: read at each call), each from its minimum contract on (``contract_refusal``; kubernetes-aggregator from v1.14).


def api_disrupting(targets: Iterable[Target]) -> bool:
    """Some target's passes restart kube-apiserver or reboot its node: with one control plane the API is away
    meanwhile."""
    return any(t.description.restarts_apiserver or t.description.reboot_roll for t in targets)


#: docs/decisions.md#aggregator-ca: ichord restarts none of them; the plan and the completion message say so.
EXTENSION_APISERVERS_NOTE = ("extension API servers (metrics-server and the like) that read the aggregator CA only "
                             "once must be restarted by their owners; ichord restarts none of them")


class UnsupportedTargetError(IchordError):
    """The operation names a target this executor does not rotate yet; nothing is written."""


class TargetSpecError(IchordError):
    """spec.caRotation.targets is malformed."""


def spec_targets(op: dict[str, Any]) -> tuple[Target, ...]:
    """The effective targets of ``op``'s spec (absent = talos, kubernetes), refused when unsupported."""
    names = ((op.get("spec") or {}).get("caRotation") or {}).get("targets")
    try:
        targets = parse_targets(list(names) if names else None)
    except RotationError as exc:
        raise TargetSpecError(str(exc)) from None
    supported_targets = target_order()
    unsupported = [t.value for t in targets if t not in supported_targets]
    if unsupported:
        supported = ", ".join(t.value for t in supported_targets)
        raise UnsupportedTargetError(
            f"target(s) {', '.join(unsupported)} are not rotated by this version of ichord yet; create the "
            f"operation with spec.caRotation.targets limited to {supported}")
    return targets


def contract_refusal(targets: Iterable[Target], contract: VersionContract) -> str | None:
    """Why the cluster's version contract cannot take these targets (docs/decisions.md#ca-rotation-passes), or None."""
    try:
        check_targets(targets, contract)
    except StageRenderError as exc:
        return str(exc)
    return None


def hands_off(targets: Iterable[Target]) -> bool:
    """AwaitingCredentials exists only when the operator's credentials change
    (docs/decisions.md#credentials-handoff)."""
    return any(t.description.hands_off for t in targets)


def stages(targets: Iterable[Target]) -> tuple[Stage, ...]:
    """The stage sequence the plan shows (Done excluded)."""
    seq = [Stage.ACCEPTING]
    if hands_off(targets):
        seq.append(Stage.AWAITING_CREDENTIALS)
    return (*seq, Stage.ISSUING, Stage.DROPPING, Stage.FINALIZING)


def next_stage(stage: Stage, targets: Iterable[Target]) -> Stage:
    """The stage after ``stage``; the sequence only moves forward."""
    if stage is Stage.DONE:
        return Stage.DONE
    seq = (*stages(targets), Stage.DONE)
    if stage not in seq:
        raise ValueError(f"stage {stage.value} is not part of this rotation")
    return seq[seq.index(stage) + 1]


@dataclass(frozen=True)
class PlannedMachine:
    name: str
    role: str


def machine_order(machines: Iterable[PlannedMachine]) -> list[PlannedMachine]:
    """Control planes first, then workers, each by name (the order every pass visits them)."""
    return sorted(machines, key=lambda m: (m.role != "controlplane", m.name))


def plan_status(targets: Sequence[Target], machines: Iterable[PlannedMachine],
                worker_bound: WorkerBound | None = None, *, etcd_snapshot: dict[str, Any] | None = None,
                snapshot_hint: str = "take an etcd snapshot before starting (ichord cluster etcd-snapshot NAME -f "
                                     "FILE)") -> dict[str, Any]:
    """status.plan: what will be done, written before anything is (and alone when spec.paused); with
    ``worker_bound``, the workers each pass applies at once as resolved now (maxUnavailable). With the etcd target,
    ``etcd_snapshot`` (operations/etcd_snapshot.plan_entry) says where ichord takes a snapshot before the first
    reboot; without a destination the warning is ``snapshot_hint``, the command that takes one by hand."""
    ordered = machine_order(machines)
    cps = [m for m in ordered if m.role == "controlplane"]
    warnings = []
    if Target.KUBERNETES in targets:  # only a rotation of the Kubernetes CA leaves clients holding an old one
        warnings.append("in-cluster clients that load the Kubernetes CA once may need a restart; ichord restarts the "
                        "CNI, kube-proxy and coredns in kube-system after the rotation")
    if hands_off(targets):
        warnings.append("the rotation waits in AwaitingCredentials until the operator holds a talosconfig and a "
                        "kubeconfig from the new CAs (ichord cluster credentials NAME --acknowledge)")
    reboots = any(t.description.reboot_roll for t in targets)
    etcd = Target.ETCD in targets
    if etcd:
        # docs/decisions.md#etcd-reboot-roll: the control planes reboot in each pass.
        warnings.append(f"the etcd CA is loaded only at boot: every control plane reboots once in each of the three "
                        f"passes, one at a time, with etcd checked whole before and after each reboot (three reboots "
                        f"per control plane, {3 * len(cps)} for {len(cps)}); the workers do not reboot")
        if etcd_snapshot is None:
            warnings.append(snapshot_hint)
        else:
            warnings.append(f"an etcd snapshot is taken to {etcd_snapshot['directory']} before the first reboot "
                            f"(keeping the cluster's newest {etcd_snapshot['retain']}); etcdSnapshot.file names it")
    if Target.KUBERNETES_AGGREGATOR in targets:
        warnings.append(EXTENSION_APISERVERS_NOTE)
    warnings.append("after the rotation the exported secrets bundle is stale: run ichord cluster bundle-export NAME")
    plan: dict[str, Any] = {
        "targets": [t.value for t in targets],
        "stages": [s.value for s in stages(targets)],
        "machines": [{"name": m.name, "role": m.role, "order": i + 1,
                      "reboots": reboots and m.role == "controlplane"} for i, m in enumerate(ordered)],
        "warnings": warnings,
        # kube-apiserver restarts (Kubernetes, aggregator CA) or its node reboots (etcd CA): with one control plane
        # the API is gone meanwhile.
        "kubernetesAPIUnavailable": len(cps) == 1 and api_disrupting(targets),
    }
    if worker_bound is not None:
        plan["workerBound"] = worker_bound.to_status()
    if etcd and etcd_snapshot is not None:
        plan["etcdSnapshot"] = etcd_snapshot
    return plan


# ---- status.caRotation.certificates and the hand-off token ----------------------------------


def certificates_status(bundle: SecretsBundle, rotation: Rotation, stage: Stage) -> list[dict[str, Any]]:
    """Per target: previous, next, and which of them issues and is accepted at ``stage`` (fingerprints)."""
    out = []
    for t in rotation.targets:
        prev, nxt = ca_fingerprint(bundle.ca(t.ca_kind)), ca_fingerprint(rotation.new[t])
        if stage in (Stage.ACCEPTING, Stage.AWAITING_CREDENTIALS):
            issuing, accepted = prev, [prev, nxt]
        elif stage is Stage.ISSUING:
            issuing, accepted = nxt, [nxt, prev]
        else:
            issuing, accepted = nxt, [nxt]
        out.append({"name": t.value, "previous": prev, "next": nxt, "issuing": issuing, "accepted": accepted})
    return out


def handoff_token(certificates: Iterable[dict[str, Any]]) -> str:
    """CARotationHandoffToken: the new CAs' fingerprints, ``name=fp`` joined by commas in status order."""
    return ",".join(f"{c['name']}={c['next']}" for c in certificates if c.get("next"))


def replaced_by(bundle: SecretsBundle, certificates: Iterable[dict[str, Any]]) -> bool:
    """True when ``bundle`` already holds every new CA status names (the Secret was replaced)."""
    by_name = {t.value: t for t in target_order()}
    entries = [c for c in certificates if c.get("next")]
    return bool(entries) and all(
        c["name"] in by_name and ca_fingerprint(bundle.ca(by_name[c["name"]].ca_kind)) == c["next"] for c in entries)


# ---- credentials per stage ("How Ichor stays connected") ------------------------------------


def apply_dial(bundle: SecretsBundle, rotation: Rotation, stage: Stage) -> DialBundle:
    """The credentials a pass applies with: Accepting with the old client certificate, later ones with the new."""
    new_os = rotation.new.get(Target.TALOS)
    if new_os is None:
        return DialBundle.from_bundle(bundle)
    signing = bundle.os if stage is Stage.ACCEPTING else new_os
    return DialBundle.of(signing, [bundle.os.cert_pem, new_os.cert_pem])


def verify_dial(bundle: SecretsBundle, rotation: Rotation, stage: Stage) -> DialBundle:
    """The credentials a pass is verified with: the new client certificate from Accepting on (proving it works)."""
    new_os = rotation.new.get(Target.TALOS)
    if new_os is None:
        return DialBundle.from_bundle(bundle)
    return DialBundle.of(new_os, [bundle.os.cert_pem, new_os.cert_pem])
