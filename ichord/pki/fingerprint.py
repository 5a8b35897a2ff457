"""SHA-256 fingerprints of certificates and of a bundle's CA set (docs/decisions.md#rotation-state,
docs/decisions.md#credentials-handoff).

- certificate fingerprint: SHA-256 of the DER encoding, lowercase hex (what status shows);
- BundleFingerprint: a hash of the Talos and Kubernetes CA fingerprints (what the credentials
  code compares, unchanged by docs/decisions.md#ca-rotation-passes);
- ExportFingerprint: adds the etcd and aggregator CAs, so an export made before an etcd-only or
  aggregator-only rotation does not count as current (bundle-export and the expiry reconciler).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CertificateAuthority


def certificate_fingerprint(cert: x509.Certificate | bytes) -> str:
    """SHA-256 over the DER of a certificate (or of the first certificate of a PEM bundle)."""
    if isinstance(cert, bytes):
        cert = _pem.load_certificate(cert)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def ca_fingerprint(ca: CertificateAuthority) -> str:
    return certificate_fingerprint(ca.certificate)


def _combine(kind: str, parts: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256(kind.encode() + b"\n")
    for name, fp in parts:
        h.update(f"{name}={fp}\n".encode())
    return h.hexdigest()


def bundle_fingerprint(bundle: SecretsBundle) -> str:
    """BundleFingerprint: the Talos and Kubernetes CAs."""
    return _combine("bundle/v1", [("talos", ca_fingerprint(bundle.os)), ("kubernetes", ca_fingerprint(bundle.k8s))])


def export_fingerprint(bundle: SecretsBundle) -> str:
    """ExportFingerprint: the Talos, Kubernetes, etcd and aggregator CAs."""
    return _combine(
        "export/v1",
        [
            ("talos", ca_fingerprint(bundle.os)),
            ("kubernetes", ca_fingerprint(bundle.k8s)),
            ("etcd", ca_fingerprint(bundle.etcd)),
            ("kubernetes-aggregator", ca_fingerprint(bundle.k8s_aggregator)),
        ],
    )
