"""PEM and key encoding the way Talos writes it.

Talos (siderolabs/crypto) stores every certificate and key as base64 of the PEM text, and labels an
Ed25519 PKCS#8 key ``ED25519 PRIVATE KEY`` instead of the standard ``PRIVATE KEY``; OpenSSL and
``cryptography`` only know the standard label, so we relabel on the way in and out.
"""

from __future__ import annotations

import base64
import binascii
import re

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ichord.errors import IchordError

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey

ED25519_LABEL = "ED25519 PRIVATE KEY"
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----\r?\n?", re.DOTALL)


class PEMError(IchordError):
    """A certificate or key could not be decoded. The message never contains the material."""


def b64_pem_decode(value: str, what: str) -> bytes:
    """Decode a base64-of-PEM value (bundle and v1alpha1 encoding)."""
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise PEMError(f"{what} is not valid base64") from exc
    if b"-----BEGIN " not in raw:
        raise PEMError(f"{what} does not hold a PEM block")
    return raw


def b64_pem_encode(pem: bytes) -> str:
    return base64.b64encode(pem).decode("ascii")


def pem_blocks(data: bytes) -> list[bytes]:
    """Split a PEM bundle into its blocks, in order."""
    return [m.group(0) if m.group(0).endswith(b"\n") else m.group(0) + b"\n" for m in _PEM_BLOCK.finditer(data)]


def pem_label(block: bytes) -> str:
    m = _PEM_BLOCK.search(block)
    if m is None:
        raise PEMError("no PEM block found")
    return m.group(1).decode("ascii")


def load_certificate(pem: bytes, what: str = "certificate") -> x509.Certificate:
    """Load the first certificate of a PEM bundle."""
    blocks = [b for b in pem_blocks(pem) if pem_label(b) == "CERTIFICATE"]
    if not blocks:
        raise PEMError(f"{what} holds no CERTIFICATE PEM block")
    try:
        return x509.load_pem_x509_certificate(blocks[0])
    except ValueError as exc:
        raise PEMError(f"{what} is not a valid X.509 certificate") from exc


def load_certificates(pem: bytes, what: str = "certificate bundle") -> list[x509.Certificate]:
    """Load every certificate of a PEM bundle (the etcd CA field may hold two, docs/decisions.md#ca-rotation-passes)."""
    out = []
    for i, block in enumerate(b for b in pem_blocks(pem) if pem_label(b) == "CERTIFICATE"):
        try:
            out.append(x509.load_pem_x509_certificate(block))
        except ValueError as exc:
            raise PEMError(f"{what}: block {i + 1} is not a valid X.509 certificate") from exc
    if not out:
        raise PEMError(f"{what} holds no CERTIFICATE PEM block")
    return out


def load_private_key(pem: bytes, what: str = "private key") -> PrivateKey:
    """Load a private key, accepting Talos's ``ED25519 PRIVATE KEY`` label."""
    data = to_standard_label(pem)
    try:
        # ichord never signs with an RSA key (the only one is the service-account key, which it only
        # carries): OpenSSL's RSA consistency check costs ~0.3 s of CPU per load, on the event loop,
        # for every bundle parsed; the structure is still fully decoded and the key type checked.
        key = serialization.load_pem_private_key(data, password=None, unsafe_skip_rsa_key_validation=True)
    except (ValueError, TypeError) as exc:
        raise PEMError(f"{what} is not a valid unencrypted PEM private key") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PEMError(f"{what} has an unsupported key type {type(key).__name__}")
    return key


def to_standard_label(pem: bytes) -> bytes:
    """``ED25519 PRIVATE KEY`` -> ``PRIVATE KEY`` (the body is PKCS#8 either way)."""
    return pem.replace(b"-----BEGIN " + ED25519_LABEL.encode() + b"-----", b"-----BEGIN PRIVATE KEY-----").replace(
        b"-----END " + ED25519_LABEL.encode() + b"-----", b"-----END PRIVATE KEY-----"
    )


def encode_private_key(key: PrivateKey) -> bytes:
    """Encode a key the way siderolabs/crypto does.

    Ed25519: PKCS#8 labelled ``ED25519 PRIVATE KEY``; ECDSA: SEC1 ``EC PRIVATE KEY``;
    RSA: PKCS#1 ``RSA PRIVATE KEY``.
    """
    if isinstance(key, ed25519.Ed25519PrivateKey):
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return pem.replace(b"BEGIN PRIVATE KEY", b"BEGIN " + ED25519_LABEL.encode()).replace(
            b"END PRIVATE KEY", b"END " + ED25519_LABEL.encode()
        )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def encode_certificate(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def public_key_bytes(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_matches_certificate(key: PrivateKey, cert: x509.Certificate) -> bool:
    pub = cert.public_key()
    if not isinstance(pub, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        return False
    return public_key_bytes(key.public_key()) == public_key_bytes(pub)
