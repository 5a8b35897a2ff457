"""The simulated API server's serving certificate, signed by a chosen (switchable) Kubernetes CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord.pki import pem as _pem
from ichord.pki.ca import CertificateAuthority
from ichord.pki.memfile import load_cert_chain_from_memory

#: Names a kube-apiserver certificate carries (Talos adds the node IPs and the endpoint host).
DEFAULT_DNS = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
               "kubernetes.default.svc.cluster.local")


@dataclass(frozen=True)
class ServingCertificate:
    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def issue_serving_certificate(ca: CertificateAuthority, hosts: Sequence[str],
                              *, lifetime: dt.timedelta = dt.timedelta(days=365),
                              client_auth: bool = False) -> ServingCertificate:
    """A kube-apiserver-like server certificate for ``hosts`` (IPs and DNS names) plus the defaults;
    ``client_auth`` adds the ClientAuth usage (etcd dials its own client endpoint with it)."""
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])]
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = []
    names = list(dict.fromkeys([*hosts, *DEFAULT_DNS]))
    for host in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    ca_key = ca.private_key
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + lifetime)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Go sets the AuthorityKeyId from the issuer; rotated Talos CAs share one subject, so without it
        # a verifier holding old and new CA cannot tell which one signed.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
            ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value), critical=False)
        .sign(ca_key, None if ca_key.__class__.__name__.startswith("Ed25519") else hashes.SHA256())
    )
    return ServingCertificate(_pem.encode_certificate(cert), _pem.encode_private_key(key))


def server_ssl_context(serving: ServingCertificate) -> ssl.SSLContext:
    """An SSLContext for the server; the key is loaded from memory (pki/memfile.py), never written to disk."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_cert_chain_from_memory(ctx, serving.cert_pem, serving.key_pem)
    return ctx
