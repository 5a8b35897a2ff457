"""The CA-rotation stage table, row by row, for both contracts and both roles (docs/decisions.md#ca-rotation-passes)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from functools import cache

import pytest

from ichord.api.carotation import Stage
from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.pem import b64_pem_decode, pem_blocks
from ichord.pki.rotation import TARGET_ORDER, Rotation, Target, generate_rotation
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import STAGE_TABLE, StageRenderError, Which, render_stage

ROLES = ("controlplane", "worker")
CONTRACTS = (V1_13, V1_14)
ROTATING_STAGES = (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING, Stage.FINALIZING)

#: docs/decisions.md#ca-rotation-passes written out independently of the code's table: (signing CA, also trusted CA).
ADR_TABLE = {
    Stage.ACCEPTING: ("old", "new"),
    Stage.ISSUING: ("new", "old"),
    Stage.DROPPING: ("new", None),
    Stage.FINALIZING: ("new", None),
}


@cache
def _bundle() -> SecretsBundle:
    return generate_bundle()


@cache
def _rotation() -> Rotation:
    return generate_rotation(TARGET_ORDER)


def _cluster(contract: VersionContract) -> ClusterInputs:
    return ClusterInputs.from_spec(
        "demo",
        {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1", "talosVersion": str(contract)},
    )


def _machine(role: str) -> MachineInputs:
    return MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role})


def _fp(pem: bytes) -> str:
    return certificate_fingerprint(pem)


def _fps_b64(value: str) -> list[str]:
    return [_fp(b) for b in pem_blocks(b64_pem_decode(value, "test"))]


def _fps_pem(values: list[object]) -> list[str]:
    return [_fp(str(v).encode()) for v in values]


def _targets_for(contract: VersionContract) -> tuple[Target, ...]:
    return (
        TARGET_ORDER
        if contract.multidoc_kubernetes
        else tuple(t for t in TARGET_ORDER if t is not Target.KUBERNETES_AGGREGATOR)
    )


def _cas(config: MachineConfig, contract: VersionContract, cp: bool) -> dict[Target, tuple[list[str], list[str], bool]]:
    """Per target: (signing certificate fingerprints, accepted fingerprints, whether a key is present)."""
    out: dict[Target, tuple[list[str], list[str], bool]] = {}
    v1 = config.v1alpha1
    m = v1["machine"]
    out[Target.TALOS] = (
        _fps_b64(m["ca"]["crt"]),
        [f for e in m.get("acceptedCAs") or [] for f in _fps_b64(e["crt"])],
        bool(m["ca"].get("key")),
    )
    if contract.multidoc_kubernetes:
        doc = config.find("KubeAPIServerCAConfig")
        assert doc is not None
        issuing = doc.get("issuingCA")
        out[Target.KUBERNETES] = (
            _fps_pem([issuing["cert"]]) if issuing else [],
            _fps_pem(doc.get("acceptedCAs") or []),
            bool(issuing and issuing.get("key")),
        )
        agg = config.find("KubeAggregatorCAConfig")
        if cp:
            assert agg is not None
            out[Target.KUBERNETES_AGGREGATOR] = (
                _fps_pem([agg["issuingCA"]["cert"]]),
                _fps_pem(agg.get("acceptedCAs") or []),
                bool(agg["issuingCA"].get("key")),
            )
        else:
            assert agg is None
    else:
        c = v1["cluster"]
        out[Target.KUBERNETES] = (
            _fps_b64(c["ca"]["crt"]),
            [f for e in c.get("acceptedCAs") or [] for f in _fps_b64(e["crt"])],
            bool(c["ca"].get("key")),
        )
    etcd = (v1["cluster"].get("etcd") or {}).get("ca")
    if cp:
        assert etcd is not None
        out[Target.ETCD] = (_fps_b64(etcd["crt"]), [], bool(etcd.get("key")))
    else:
        assert etcd is None
    return out


def _cases() -> Iterator[tuple[VersionContract, str, Stage, Target]]:
    for contract in CONTRACTS:
        for role in ROLES:
            for stage in ROTATING_STAGES:
                for target in _targets_for(contract):
                    if role == "worker" and target in (Target.ETCD, Target.KUBERNETES_AGGREGATOR):
                        continue
                    yield contract, role, stage, target


@pytest.mark.parametrize(
    ("contract", "role", "stage", "target"), list(_cases()), ids=lambda v: str(getattr(v, "value", v))
)
def test_stage_table_row(contract: VersionContract, role: str, stage: Stage, target: Target) -> None:
    bundle, rotation = _bundle(), _rotation()
    cp = role == "controlplane"
    config = render_stage(bundle, rotation, stage, _cluster(contract), _machine(role), targets=(target,))
    cas = _cas(config, contract, cp)
    old, new = _fp(bundle.ca(target.ca_kind).cert_pem), _fp(rotation.new[target].cert_pem)
    want_signing, want_trusted = ADR_TABLE[stage]
    signing = old if want_signing == "old" else new
    trusted = None if want_trusted is None else (old if want_trusted == "old" else new)
    signing_fps, accepted, has_key = cas[target]

    if target is Target.ETCD:
        # one PEM bundle: signing first, then the trusted one; the key is the signing CA's
        assert signing_fps == [signing] + ([trusted] if trusted else [])
        key = b64_pem_decode(config.v1alpha1["cluster"]["etcd"]["ca"]["key"], "k")
        signer = bundle.etcd if want_signing == "old" else rotation.new[Target.ETCD]
        assert key == signer.key_pem
    elif target is Target.KUBERNETES and contract.multidoc_kubernetes and not cp:
        # workers hold the Kubernetes CA only as accepted certificates, the signing one first
        assert signing_fps == []
        assert accepted == [signing] + ([trusted] if trusted else [])
    else:
        assert signing_fps == [signing]
        assert accepted == ([trusted] if trusted else [])
    assert has_key == cp, "workers never receive a CA key; control planes sign with one"

    # every other target renders exactly as before
    before = _cas(render(bundle, _cluster(contract), _machine(role)), contract, cp)
    for other, value in before.items():
        if other is not target:
            assert cas[other] == value, other


@pytest.mark.parametrize("contract", CONTRACTS, ids=str)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("stage", [Stage.DROPPING, Stage.FINALIZING, Stage.DONE])
def test_dropping_is_byte_for_byte_the_new_bundle_render(contract: VersionContract, role: str, stage: Stage) -> None:
    bundle, rotation = _bundle(), _rotation()
    targets = _targets_for(contract)
    staged = render_stage(bundle, rotation, stage, _cluster(contract), _machine(role), targets=targets)
    new_bundle = Rotation({t: rotation.new[t] for t in targets}).apply_to(bundle)
    plain = render(new_bundle, _cluster(contract), _machine(role))
    assert staged.to_bytes() == plain.to_bytes()
    # and through a Secret round trip of the replaced bundle
    reread = SecretsBundle.from_yaml(new_bundle.to_yaml())
    assert render(reread, _cluster(contract), _machine(role)).hash() == staged.hash()


@pytest.mark.parametrize("contract", CONTRACTS, ids=str)
@pytest.mark.parametrize("role", ROLES)
def test_no_target_renders_as_before(contract: VersionContract, role: str) -> None:
    bundle, rotation = _bundle(), _rotation()
    for stage in ROTATING_STAGES:
        staged = render_stage(bundle, rotation, stage, _cluster(contract), _machine(role), targets=())
        assert staged.to_bytes() == render(bundle, _cluster(contract), _machine(role)).to_bytes()


@pytest.mark.parametrize("role", ROLES)
def test_workers_never_receive_a_key(role: str) -> None:
    bundle, rotation = _bundle(), _rotation()
    for contract in CONTRACTS:
        for stage in ROTATING_STAGES:
            text = render_stage(
                bundle, rotation, stage, _cluster(contract), _machine(role), targets=_targets_for(contract)
            ).to_yaml()
            secret_keys = [ca.key_pem for ca in rotation.new.values()] + [
                bundle.os.key_pem,
                bundle.k8s.key_pem,
                bundle.etcd.key_pem,
                bundle.k8s_aggregator.key_pem,
            ]
            for key in secret_keys:
                assert key is not None
                present = key.decode() in text or base64.b64encode(key).decode() in text
                if role == "worker":
                    assert not present


def test_aggregator_refused_on_v1_13() -> None:
    with pytest.raises(StageRenderError, match=r"kubernetes-aggregator target needs the v1\.14 contract"):
        render_stage(
            _bundle(),
            _rotation(),
            Stage.ACCEPTING,
            _cluster(V1_13),
            _machine("controlplane"),
            targets=(Target.KUBERNETES_AGGREGATOR,),
        )


def test_target_missing_from_rotation_refused() -> None:
    rot = Rotation({Target.TALOS: _rotation().new[Target.TALOS]})
    with pytest.raises(StageRenderError, match="no new CA for target"):
        render_stage(_bundle(), rot, Stage.ISSUING, _cluster(V1_14), _machine("worker"), targets=(Target.ETCD,))


def test_default_targets_come_from_rotation_yaml() -> None:
    rot = Rotation({Target.TALOS: _rotation().new[Target.TALOS]})
    config = render_stage(_bundle(), rot, Stage.ISSUING, _cluster(V1_14), _machine("controlplane"))
    cas = _cas(config, V1_14, True)
    assert cas[Target.TALOS][0] == [_fp(rot.new[Target.TALOS].cert_pem)]
    assert cas[Target.KUBERNETES][0] == [_fp(_bundle().k8s.cert_pem)]


def test_awaiting_credentials_keeps_accepting_configuration() -> None:
    assert STAGE_TABLE[Stage.AWAITING_CREDENTIALS] == STAGE_TABLE[Stage.ACCEPTING]
    assert STAGE_TABLE[Stage.ACCEPTING].signing is Which.OLD
