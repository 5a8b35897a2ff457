"""CA generation with Talos's algorithms, subjects, usages and validity; Talos API client certificates."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord.pki import pem
from ichord.pki.bundle import generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, KeyAlgorithm, generate_ca, issue_talos_client_certificate

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("kind", "key_type", "org", "cn"),
    [
        (CAKind.OS, ed25519.Ed25519PrivateKey, "talos", None),
        (CAKind.ETCD, ec.EllipticCurvePrivateKey, "etcd", None),
        (CAKind.KUBERNETES, ec.EllipticCurvePrivateKey, "kubernetes", None),
        (CAKind.AGGREGATOR, ec.EllipticCurvePrivateKey, None, "front-proxy"),
    ],
)
def test_ca_profile(kind: CAKind, key_type: type, org: str | None, cn: str | None) -> None:
    ca = generate_ca(kind, now=NOW)
    cert = ca.certificate
    key = ca.private_key
    assert isinstance(key, key_type)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        assert key.curve.name == "secp256r1"
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    assert orgs == ([org] if org else [])
    assert cns == ([cn] if cn else [])
    assert cert.issuer == cert.subject
    assert cert.not_valid_before_utc == NOW
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == CA_VALIDITY == dt.timedelta(days=3650)
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.digital_signature and not ku.value.key_encipherment
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    cert.verify_directly_issued_by(cert)


def test_service_account_key_is_rsa_4096() -> None:
    key = pem.load_private_key(generate_bundle().k8s_service_account_key)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096


@pytest.mark.parametrize("kind", [CAKind.OS, CAKind.KUBERNETES])
def test_client_certificate(kind: CAKind) -> None:
    ca = generate_ca(kind)
    client = issue_talos_client_certificate(ca, ["os:admin", "os:reader"], lifetime=dt.timedelta(hours=2), now=NOW)
    cert = pem.load_certificate(client.cert_pem)
    key = pem.load_private_key(client.key_pem)
    assert type(key.public_key()) is type(ca.private_key.public_key())  # key type follows the CA
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["os:admin", "os:reader"]
    assert not cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert cert.not_valid_after_utc == NOW + dt.timedelta(hours=2)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca.certificate)
    if kind is CAKind.OS:
        assert client.key_pem.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----")


def test_client_certificate_needs_the_ca_key() -> None:
    with pytest.raises(pem.PEMError):
        issue_talos_client_certificate(generate_ca(CAKind.OS).public_only())


def test_algorithm_override() -> None:
    ca = generate_ca(CAKind.OS, algorithm=KeyAlgorithm.ECDSA_P256)
    assert isinstance(ca.private_key, ec.EllipticCurvePrivateKey)
    assert "PRIVATE" not in repr(ca)
