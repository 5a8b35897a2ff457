"""CA-rotation stage overlays: what a machine runs at each stage (docs/decisions.md#ca-rotation-passes,
docs/decisions.md#rotation-state).

One table decides every target alike: at each stage one CA *signs* (issues) and at most one more is
*trusted* on top of it.

    stage        signing   also trusted
    Accepting    old       new
    Issuing      new       old
    Dropping     new       -
    Finalizing   new       -

Where that lands differs per target (the writers below), exactly as docs/decisions.md#ca-rotation-passes's table says:

    talos                   machine.ca = signing; machine.acceptedCAs += trusted
    kubernetes              KubeAPIServerCAConfig issuingCA / acceptedCAs (v1.14),
                            cluster.ca / cluster.acceptedCAs (v1.13), the way rotatepatcher does
    kubernetes-aggregator   KubeAggregatorCAConfig issuingCA / acceptedCAs (control planes, v1.14 only)
    etcd                    cluster.etcd.ca: crt = signing then trusted (one PEM bundle), key = signing's
                            (control planes)

The machine is rendered from the bundle with each target's *signing* CA swapped in, so Dropping and
Finalizing are by construction byte for byte what a bundle already holding the new CAs renders,
and a target that is not rotated renders exactly as before. Workers never receive a CA key: the
renderer gives them certificates only, and the writers add certificates only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ruamel.yaml.comments import CommentedMap

from ichord import yamlio
from ichord.api.carotation import Stage
from ichord.contract import VersionContract
from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CertificateAuthority
from ichord.pki.rotation import Rotation, Target
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs


class Which(enum.Enum):
    OLD = "old"
    NEW = "new"


@dataclass(frozen=True)
class StageRow:
    signing: Which
    trusted: Which | None


#: The stage table (docs/decisions.md#ca-rotation-passes). AwaitingCredentials keeps Accepting's configuration.
STAGE_TABLE: dict[Stage, StageRow] = {
    Stage.ACCEPTING: StageRow(signing=Which.OLD, trusted=Which.NEW),
    Stage.AWAITING_CREDENTIALS: StageRow(signing=Which.OLD, trusted=Which.NEW),
    Stage.ISSUING: StageRow(signing=Which.NEW, trusted=Which.OLD),
    Stage.DROPPING: StageRow(signing=Which.NEW, trusted=None),
    Stage.FINALIZING: StageRow(signing=Which.NEW, trusted=None),
}


class StageRenderError(IchordError):
    pass


def _is_controlplane(machine: MachineInputs) -> bool:
    role = machine.role
    return str(getattr(role, "value", role)) == "controlplane"


def _b64(cert_pem: bytes) -> str:
    return _pem.b64_pem_encode(cert_pem)


def _pem_text(cert_pem: bytes) -> str:
    return cert_pem.decode()


def _append_unique(seq: list[object], item: object, key: Callable[[object], object]) -> None:
    if all(key(x) != key(item) for x in seq):
        seq.append(item)


def _ensure_list(doc: CommentedMap, key: str) -> list[object]:
    value = doc.get(key)
    if not isinstance(value, list):
        value = []
        doc[key] = value
    return value


# ---- writers: add one trusted CA certificate to a rendered configuration ------------------------


def _trust_talos(config: MachineConfig, cert_pem: bytes, _cp: bool, _contract: VersionContract) -> None:
    machine = config.v1alpha1.setdefault("machine", CommentedMap())
    accepted = _ensure_list(machine, "acceptedCAs")
    entry = CommentedMap()
    entry["crt"] = _b64(cert_pem)
    _append_unique(accepted, entry, lambda e: e.get("crt") if isinstance(e, dict) else e)


def _trust_multidoc(kind: str) -> Callable[[MachineConfig, bytes, bool, VersionContract], None]:
    def write(config: MachineConfig, cert_pem: bytes, _cp: bool, _contract: VersionContract) -> None:
        doc = config.find(kind)
        if doc is None:
            raise StageRenderError(f"the rendered configuration has no {kind} document to add the new CA to")
        accepted = _ensure_list(doc, "acceptedCAs")
        # rotatepatcher's K8sAddAcceptedCA: append only if not already there.
        _append_unique(accepted, yamlio.literal(_pem_text(cert_pem)), lambda e: str(e).strip())

    return write


def _trust_kubernetes(config: MachineConfig, cert_pem: bytes, cp: bool, contract: VersionContract) -> None:
    if config.find("KubeAPIServerCAConfig") is not None:
        _trust_multidoc("KubeAPIServerCAConfig")(config, cert_pem, cp, contract)
        return
    cluster = config.v1alpha1.setdefault("cluster", CommentedMap())
    accepted = _ensure_list(cluster, "acceptedCAs")
    entry = CommentedMap()
    entry["crt"] = _b64(cert_pem)
    _append_unique(accepted, entry, lambda e: e.get("crt") if isinstance(e, dict) else e)


def _trust_aggregator(config: MachineConfig, cert_pem: bytes, cp: bool, contract: VersionContract) -> None:
    if not cp:
        return  # KubeAggregatorCAConfig is control-plane only
    _trust_multidoc("KubeAggregatorCAConfig")(config, cert_pem, cp, contract)


def _trust_etcd(config: MachineConfig, cert_pem: bytes, cp: bool, _contract: VersionContract) -> None:
    if not cp:
        return  # workers run no etcd and carry no etcd CA
    cluster = config.v1alpha1.get("cluster") or {}
    ca = (cluster.get("etcd") or {}).get("ca")
    if not isinstance(ca, dict) or not ca.get("crt"):
        raise StageRenderError("the rendered control-plane configuration has no cluster.etcd.ca")
    # The first PEM block signs (with the key), the whole field is trusted (docs/decisions.md#ca-rotation-passes).
    signing = _pem.b64_pem_decode(str(ca["crt"]), "cluster.etcd.ca.crt")
    ca["crt"] = _b64(signing + cert_pem)


#: ichord's own targets' writers; a target registered with a ``render_writer`` brings its own (``writer``).
WRITERS: dict[Target, Callable[[MachineConfig, bytes, bool, VersionContract], None]] = {
    Target.TALOS: _trust_talos,
    Target.KUBERNETES: _trust_kubernetes,
    Target.KUBERNETES_AGGREGATOR: _trust_aggregator,
    Target.ETCD: _trust_etcd,
}


def check_targets(targets: Iterable[Target], contract: VersionContract) -> None:
    """Refuse what a contract cannot do (each target's minimum contract, ichord/pki/targets): the aggregator has no
    accepted list before v1.14."""
    for target in targets:
        minimum = target.description.minimum_contract
        if minimum is not None and contract < minimum:
            why = target.description.minimum_contract_why.format(contract=contract)
            raise StageRenderError(
                f"the {target.value} target needs the {minimum} contract {why}. Rotate the other targets, "
                f"or move the cluster to contract {minimum} first."
            )


def render_stage(
    bundle: SecretsBundle,
    rotation: Rotation,
    stage: Stage,
    cluster: ClusterInputs,
    machine: MachineInputs,
    targets: Iterable[Target] | None = None,
) -> MachineConfig:
    """The configuration ``machine`` runs at ``stage`` of ``rotation``.

    ``targets`` defaults to what rotation.yaml holds; naming a target it does not hold is an error.
    """
    if stage is Stage.DONE:
        stage = Stage.FINALIZING
    row = STAGE_TABLE[stage]
    chosen = tuple(targets) if targets is not None else rotation.targets
    missing = [t.value for t in chosen if t not in rotation.new]
    if missing:
        raise StageRenderError(f"rotation.yaml holds no new CA for target(s) {', '.join(missing)}")
    check_targets(chosen, cluster.contract)

    def pick(target: Target, which: Which) -> CertificateAuthority:
        return rotation.new[target] if which is Which.NEW else bundle.ca(target.ca_kind)

    signing_bundle = bundle.with_cas({t.ca_kind: pick(t, row.signing) for t in chosen})
    config = render(signing_bundle, cluster, machine)
    if row.trusted is None:
        return config
    cp = _is_controlplane(machine)
    for t in chosen:
        writer(t)(config, pick(t, row.trusted).cert_pem, cp, cluster.contract)
    return config


def writer(target: Target) -> Callable[[MachineConfig, bytes, bool, VersionContract], None]:
    """The target's render writer: its description's, else ichord's own for the targets it ships (``WRITERS``)."""
    own = target.description.render_writer or WRITERS.get(target)
    if own is None:
        raise StageRenderError(f"the {target.value} target has no render writer (its description names none)")
    return own
