"""Leaf certificates a simulated node makes for itself, as Talos does (siderolabs/crypto rules).

apid serving certificate: signed by the issuing OS CA, CommonName = node name, SANs = the node's
IPs, 127.0.0.1 and its names, ExtKeyUsage ServerAuth, 24 h, key type following the CA. etcd leaf
certificates: signed by the first block of cluster.etcd.ca.crt.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord.pki import pem as _pem
from ichord.pki.ca import key_usage
from ichord.pki.pem import PrivateKey

SERVING_VALIDITY = dt.timedelta(hours=24)


def key_like(ca_key: PrivateKey) -> PrivateKey:
    """A new key of the CA's type (Ed25519 -> Ed25519, ECDSA -> P-256, RSA -> RSA 2048 for speed)."""
    if isinstance(ca_key, ed25519.Ed25519PrivateKey):
        return ed25519.Ed25519PrivateKey.generate()
    if isinstance(ca_key, ec.EllipticCurvePrivateKey):
        return ec.generate_private_key(ec.SECP256R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def sign_leaf(ca_cert_pem: bytes, ca_key_pem: bytes, *, common_name: str | None = None,
              organizations: Sequence[str] = (), ips: Sequence[str] = (), dns: Sequence[str] = (),
              usages: Sequence[x509.ObjectIdentifier] = (ExtendedKeyUsageOID.SERVER_AUTH,),
              validity: dt.timedelta = SERVING_VALIDITY) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM in Talos's encoding) signed by the first certificate of ``ca_cert_pem``."""
    ca_cert = _pem.load_certificate(ca_cert_pem)
    ca_key = _pem.load_private_key(ca_key_pem)
    key = key_like(ca_key)
    now = dt.datetime.now(dt.UTC)
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    alt: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
    alt += [x509.DNSName(d) for d in dict.fromkeys(dns)]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + validity)
        .add_extension(key_usage(key_encipherment=isinstance(key, rsa.RSAPrivateKey)), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    # Go's x509 copies the parent's SubjectKeyId into AuthorityKeyId: with two CAs of the same subject
    # (during a rotation) that is what lets a verifier pick the right issuer.
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                                        critical=False)
    except x509.ExtensionNotFound:
        pass
    digest = None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    cert = builder.sign(ca_key, digest)
    return _pem.encode_certificate(cert), _pem.encode_private_key(key)


def fingerprint(pem: bytes) -> str:
    return _pem.load_certificate(pem).fingerprint(hashes.SHA256()).hex()
