"""Certificate authorities with Talos's algorithms, subjects, usages and validity.

Talos (`pkg/machinery/config/generate/secrets/ca.go` + siderolabs/crypto) makes every CA self-signed,
valid 87600 h (10 years) from generation, KeyUsage CertSign+DigitalSignature (critical),
ExtKeyUsage ServerAuth+ClientAuth, BasicConstraints CA (critical) and a SubjectKeyIdentifier.
"""

from __future__ import annotations

import datetime as dt
import enum
import secrets as _secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord.pki import pem as _pem
from ichord.pki.pem import PrivateKey

CA_VALIDITY = dt.timedelta(hours=87600)
#: Talos's TalosAPIDefaultCertificateValidityDuration.
CLIENT_CERT_VALIDITY = dt.timedelta(days=365)


class KeyAlgorithm(enum.Enum):
    ED25519 = "ed25519"
    ECDSA_P256 = "ecdsa-p256"
    RSA_4096 = "rsa-4096"


class CAKind(enum.Enum):
    """The CAs of a Talos secrets bundle (bundle key in the value)."""

    OS = "os"
    ETCD = "etcd"
    KUBERNETES = "k8s"
    AGGREGATOR = "k8saggregator"


@dataclass(frozen=True)
class CAProfile:
    algorithm: KeyAlgorithm
    organization: str | None
    common_name: str | None


#: What Talos generates for each CA (Talos's API definitions).
CA_PROFILES: dict[CAKind, CAProfile] = {
    CAKind.OS: CAProfile(KeyAlgorithm.ED25519, organization="talos", common_name=None),
    CAKind.ETCD: CAProfile(KeyAlgorithm.ECDSA_P256, organization="etcd", common_name=None),
    CAKind.KUBERNETES: CAProfile(KeyAlgorithm.ECDSA_P256, organization="kubernetes", common_name=None),
    CAKind.AGGREGATOR: CAProfile(KeyAlgorithm.ECDSA_P256, organization=None, common_name="front-proxy"),
}


def generate_key(algorithm: KeyAlgorithm) -> PrivateKey:
    if algorithm is KeyAlgorithm.ED25519:
        return ed25519.Ed25519PrivateKey.generate()
    if algorithm is KeyAlgorithm.ECDSA_P256:
        return ec.generate_private_key(ec.SECP256R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=4096)


def _signature_hash(key: PrivateKey) -> hashes.SHA256 | None:
    # Ed25519 signs without a separate digest; ECDSA and RSA use SHA-256 (siderolabs/crypto).
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _serial() -> int:
    # 128-bit random serial, as Go's crypto/x509 callers in siderolabs/crypto do.
    return int.from_bytes(_secrets.token_bytes(16), "big") >> 1


def _name(
    organization: str | None = None, common_name: str | None = None, organizations: Sequence[str] = ()
) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA as the bundle holds it: PEM certificate and (optionally) PEM key, in Talos's encoding."""

    cert_pem: bytes
    key_pem: bytes | None = field(default=None, repr=False)

    @cached_property
    def certificate(self) -> x509.Certificate:
        return _pem.load_certificate(self.cert_pem)

    @cached_property
    def private_key(self) -> PrivateKey:
        if self.key_pem is None:
            raise _pem.PEMError("this CA has no private key")
        return _pem.load_private_key(self.key_pem)

    @property
    def not_after(self) -> dt.datetime:
        return self.certificate.not_valid_after_utc

    def public_only(self) -> CertificateAuthority:
        return CertificateAuthority(self.cert_pem, None)

    def __repr__(self) -> str:  # never print key material
        return f"CertificateAuthority(subject={self.certificate.subject.rfc4514_string()!r})"


def key_usage(*, cert_sign: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    """DigitalSignature, plus CertSign for a CA, plus KeyEncipherment for an RSA server key (Go's habit)."""
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=key_encipherment,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=False,
                         encipher_only=False, decipher_only=False)


def generate_ca(
    kind: CAKind | CAProfile, *, now: dt.datetime | None = None, algorithm: KeyAlgorithm | None = None
) -> CertificateAuthority:
    """Generate a self-signed CA exactly as Talos does for ``kind`` (or as ``kind``, a profile, says: a CA-rotation
    target whose CA is not one of Talos's four carries its own, ichord/pki/targets)."""
    profile = kind if isinstance(kind, CAProfile) else CA_PROFILES[kind]
    key = generate_key(algorithm or profile.algorithm)
    now = now or dt.datetime.now(dt.UTC)
    subject = _name(profile.organization, profile.common_name)
    pub = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(pub)
        .serial_number(_serial())
        .not_valid_before(now)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(key_usage(cert_sign=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
    )
    cert = builder.sign(key, _signature_hash(key))
    return CertificateAuthority(_pem.encode_certificate(cert), _pem.encode_private_key(key))


def _algorithm_of(key: PrivateKey) -> KeyAlgorithm:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return KeyAlgorithm.ED25519
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return KeyAlgorithm.ECDSA_P256
    return KeyAlgorithm.RSA_4096


@dataclass(frozen=True)
class ClientCertificate:
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def __repr__(self) -> str:
        return "ClientCertificate(<redacted>)"


def issue_client_certificate(
    ca: CertificateAuthority,
    organizations: Sequence[str],
    *,
    common_name: str | None = None,
    lifetime: dt.timedelta = CLIENT_CERT_VALIDITY,
    now: dt.datetime | None = None,
    key_factory: Callable[[KeyAlgorithm], PrivateKey] = generate_key,
) -> ClientCertificate:
    """A client certificate signed by ``ca``: groups/roles in Organization, KeyUsage DigitalSignature,
    ExtKeyUsage ClientAuth only, and a key of the CA's type. Valid from a minute ago (a peer's clock may
    be slightly behind ours)."""
    ca_key = ca.private_key
    key = key_factory(_algorithm_of(ca_key))
    now = now or dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(organizations=organizations, common_name=common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + lifetime)
        .add_extension(key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.certificate.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, _signature_hash(ca_key))
    )
    return ClientCertificate(_pem.encode_certificate(cert), _pem.encode_private_key(key))


def issue_talos_client_certificate(
    ca: CertificateAuthority,
    roles: Sequence[str] = ("os:admin",),
    *,
    lifetime: dt.timedelta = CLIENT_CERT_VALIDITY,
    now: dt.datetime | None = None,
    key_factory: Callable[[KeyAlgorithm], PrivateKey] = generate_key,
) -> ClientCertificate:
    """A Talos API client certificate, as ``GenerateTalosAPIClientCertificate`` makes it: roles in
    Organization, no CommonName, ClientAuth only (apid refuses anything else), the key following the CA's."""
    return issue_client_certificate(ca, roles, lifetime=lifetime, now=now, key_factory=key_factory)
