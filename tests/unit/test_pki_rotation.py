"""Fingerprints and the rotation.yaml model."""

from __future__ import annotations

import pytest

from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.fingerprint import bundle_fingerprint, ca_fingerprint, certificate_fingerprint, export_fingerprint
from ichord.pki.rotation import DEFAULT_TARGETS, Rotation, RotationError, Target, generate_rotation, parse_targets


def test_certificate_fingerprint_is_sha256_of_der() -> None:
    import hashlib

    from cryptography.hazmat.primitives import serialization

    ca = generate_bundle().os
    der = ca.certificate.public_bytes(serialization.Encoding.DER)
    assert certificate_fingerprint(ca.cert_pem) == hashlib.sha256(der).hexdigest() == ca_fingerprint(ca)


def test_bundle_and_export_fingerprints() -> None:
    b = generate_bundle()
    other = generate_bundle()
    assert bundle_fingerprint(b) == bundle_fingerprint(SecretsBundle.from_yaml(b.to_yaml()))
    etcd_rotated = b.with_cas({CAKind.ETCD: other.etcd})
    assert bundle_fingerprint(etcd_rotated) == bundle_fingerprint(b)  # talos + kubernetes only
    assert export_fingerprint(etcd_rotated) != export_fingerprint(b)
    agg_rotated = b.with_cas({CAKind.AGGREGATOR: other.k8s_aggregator})
    assert export_fingerprint(agg_rotated) != export_fingerprint(b)
    os_rotated = b.with_cas({CAKind.OS: other.os})
    assert bundle_fingerprint(os_rotated) != bundle_fingerprint(b)
    assert export_fingerprint(os_rotated) != export_fingerprint(b)
    assert bundle_fingerprint(b) != export_fingerprint(b)


def test_parse_targets() -> None:
    assert parse_targets(None) == DEFAULT_TARGETS == (Target.TALOS, Target.KUBERNETES)
    assert parse_targets([]) == DEFAULT_TARGETS
    assert parse_targets(["kubernetes-aggregator", "talos"]) == (Target.TALOS, Target.KUBERNETES_AGGREGATOR)
    with pytest.raises(RotationError, match="listed twice"):
        parse_targets(["etcd", "etcd"])
    with pytest.raises(RotationError, match="unknown CA-rotation target 'os'"):
        parse_targets(["os"])


def test_rotation_yaml_round_trip_and_targets() -> None:
    rot = generate_rotation((Target.ETCD, Target.TALOS, Target.KUBERNETES_AGGREGATOR))
    assert rot.targets == (Target.TALOS, Target.ETCD, Target.KUBERNETES_AGGREGATOR)
    text = rot.to_yaml()
    assert [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")] == [
        "talos",
        "etcd",
        "aggregator",
    ]
    again = Rotation.from_yaml(text)
    assert again.targets == rot.targets
    assert again.fingerprints() == rot.fingerprints()
    assert again.to_yaml() == text
    assert again.new[Target.TALOS].key_pem is not None
    assert again.new[Target.TALOS].key_pem.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----")


def test_rotation_apply_replaces_only_its_keys() -> None:
    bundle = generate_bundle()
    rot = generate_rotation((Target.KUBERNETES,))
    out = rot.apply_to(bundle)
    assert ca_fingerprint(out.k8s) == ca_fingerprint(rot.new[Target.KUBERNETES])
    assert out.os == bundle.os and out.etcd == bundle.etcd and out.k8s_aggregator == bundle.k8s_aggregator
    assert (out.cluster_id, out.cluster_secret) == (bundle.cluster_id, bundle.cluster_secret)
    reread = SecretsBundle.from_yaml(out.to_yaml())
    assert ca_fingerprint(reread.k8s) == ca_fingerprint(rot.new[Target.KUBERNETES])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}\n", "holds no CA"),
        ("other: {crt: x, key: y}\n", "unknown key 'other'"),
        ("talos: {crt: LS0t}\n", "talos needs crt and key"),
        ("talos: [\n", "not valid YAML"),
    ],
)
def test_invalid_rotation_yaml(text: str, expected: str) -> None:
    with pytest.raises(RotationError, match=expected):
        Rotation.from_yaml(text)


def test_rotation_key_mismatch_refused() -> None:
    a = generate_rotation((Target.TALOS,)).to_yaml()
    b = generate_rotation((Target.TALOS,)).to_yaml()
    mixed = a.splitlines()[0] + "\n" + a.splitlines()[1] + "\n" + b.splitlines()[2] + "\n"
    with pytest.raises(RotationError, match="does not belong"):
        Rotation.from_yaml(mixed)
