"""The etcd PKI checks tell the old and the new etcd CA apart by key, not by subject (both are O=etcd)."""

from __future__ import annotations

import pytest

from ichord.api.carotation import Stage
from ichord.operations.ca_rotation.etcd_pki import expected_pki, signed_by
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.sim.talos.certs import sign_leaf


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
def rotation(bundle: SecretsBundle) -> Rotation:
    return generate_rotation((Target.ETCD,))


def test_old_and_new_share_a_subject_and_only_the_signing_key_tells_them_apart(
        bundle: SecretsBundle, rotation: Rotation) -> None:
    old, new = bundle.etcd, rotation.new[Target.ETCD]
    assert _pem.load_certificate(old.cert_pem).subject == _pem.load_certificate(new.cert_pem).subject
    assert old.key_pem is not None and new.key_pem is not None
    leaf, _key = sign_leaf(new.cert_pem, new.key_pem, common_name="cp-1", ips=["10.0.0.1"])
    assert _pem.load_certificate(leaf).issuer == _pem.load_certificate(old.cert_pem).subject  # same name...
    assert signed_by(leaf, new.cert_pem)
    assert not signed_by(leaf, old.cert_pem)  # ...but not signed by the old key
    assert not signed_by(b"not a certificate", new.cert_pem)


@pytest.mark.parametrize(("stage", "order", "signer"), [
    (Stage.ACCEPTING, ["old", "new"], "old"),
    (Stage.ISSUING, ["new", "old"], "new"),
    (Stage.DROPPING, ["new"], "new"),
])
def test_the_expected_root_per_stage(bundle: SecretsBundle, rotation: Rotation, stage: Stage, order: list[str],
                                     signer: str) -> None:
    pems = {"old": bundle.etcd.cert_pem, "new": rotation.new[Target.ETCD].cert_pem}
    want = expected_pki(bundle, rotation, stage)
    assert want.bundle == tuple(_pem.pem_blocks(pems[o])[0] for o in order)
    assert want.signer == pems[signer] and want.signer_name == signer
