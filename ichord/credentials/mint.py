"""The operator's credentials from the new CAs: a talosconfig and an admin kubeconfig (pure, no I/O).

- talosconfig (Talos's ``pkg/machinery/client/config`` format): one context named after the cluster,
  endpoints = the control planes' Talos API addresses, nodes = their hosts, ``ca`` = every OS CA a
  node may serve from (old and new during a rotation), ``crt``/``key`` = an ``os:admin`` client
  certificate signed by the new OS CA.
- kubeconfig: ``admin@<cluster>`` with the cluster's API endpoint, ``certificate-authority-data`` =
  old and new Kubernetes CAs, and a client certificate CN=admin, O=system:masters signed by the new
  Kubernetes CA (what Talos's Kubeconfig RPC hands out, from the CA the operator will keep).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ichord import yamlio
from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki.ca import (
    CLIENT_CERT_VALIDITY,
    CertificateAuthority,
    ClientCertificate,
    issue_client_certificate,
    issue_talos_client_certificate,
)
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import split_endpoint
from ichord.talos.dial import DialBundle

#: What Talos's admin kubeconfig uses (CN=admin, O=system:masters, one year).
ADMIN_COMMON_NAME = "admin"
ADMIN_GROUP = "system:masters"
ADMIN_CERT_VALIDITY = dt.timedelta(days=365)


class MintError(IchordError):
    """The credentials cannot be made from the bundle (a CA without its key, a malformed file)."""


@dataclass(frozen=True)
class Minted:
    """Both files' bytes and the fingerprints of their client certificates (public, printable)."""

    talosconfig: bytes = field(repr=False)
    kubeconfig: bytes = field(repr=False)
    talos_client_fingerprint: str
    kube_client_fingerprint: str


def issue_kubernetes_admin_certificate(ca: CertificateAuthority, *, lifetime: dt.timedelta = ADMIN_CERT_VALIDITY,
                                       now: dt.datetime | None = None) -> ClientCertificate:
    """A client certificate CN=admin, O=system:masters (ClientAuth only), the key type following the CA's."""
    if ca.key_pem is None:
        raise MintError("the Kubernetes CA has no private key in the bundle; it cannot sign the admin certificate")
    cert = issue_client_certificate(ca, [ADMIN_GROUP], common_name=ADMIN_COMMON_NAME, lifetime=lifetime, now=now)
    # kubectl reads PKCS#8 under the standard label; Talos's own label is for Talos's Ed25519 keys only
    issued = ClientCertificate(cert.cert_pem, _pem.to_standard_label(cert.key_pem))
    SCRUBBER.register(issued.key_pem)
    return issued


def unique_pems(cas: Sequence[bytes]) -> list[bytes]:
    """Every certificate block once, in order (old first, then new)."""
    out: list[bytes] = []
    for ca in cas:
        for block in _pem.pem_blocks(ca):
            if block not in out:
                out.append(block)
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def talosconfig(context: str, endpoints: Sequence[str], trusted: Sequence[bytes], cert: ClientCertificate) -> bytes:
    """Talos's talosconfig YAML: ``context`` and ``contexts.<context>.{endpoints, nodes, ca, crt, key}``."""
    nodes = [split_endpoint(e)[0] for e in endpoints]
    doc = {"context": context, "contexts": {context: {
        "endpoints": list(endpoints), "nodes": nodes, "ca": _b64(b"".join(unique_pems(trusted))),
        "crt": _b64(cert.cert_pem), "key": _b64(cert.key_pem)}}}
    return yamlio.dump(doc).encode()


def kubeconfig(cluster: str, server: str, trusted: Sequence[bytes], cert: ClientCertificate, *,
               namespace: str = "default") -> bytes:
    """An admin kubeconfig as Talos names it: cluster ``<cluster>``, user and context ``admin@<cluster>``.

    The context's namespace is the TalosCluster's, so the commands a rotation's messages name (``ichord cluster
    bundle-export NAME``, ``ichord cluster status NAME``) find the cluster with this file and no ``-n``."""
    user = f"admin@{cluster}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server, "certificate-authority-data": _b64(b"".join(unique_pems(trusted)))}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(cert.cert_pem), "client-key-data": _b64(cert.key_pem)}}],
        "contexts": [{"name": user, "context": {"cluster": cluster, "namespace": namespace, "user": user}}],
        "current-context": user,
    }
    return yamlio.dump(doc).encode()


def mint(cluster: str, endpoints: Sequence[str], server: str, *, os_signing: CertificateAuthority,
         os_trusted: Sequence[bytes], k8s_signing: CertificateAuthority, k8s_trusted: Sequence[bytes],
         namespace: str = "default") -> Minted:
    """Both files, each with a fresh client certificate from its signing (new) CA; ``namespace`` is the
    kubeconfig context's (the TalosCluster's)."""
    if os_signing.key_pem is None:
        raise MintError("the OS CA has no private key in the bundle; it cannot sign the talosconfig's certificate")
    talos_cert = issue_talos_client_certificate(os_signing, ("os:admin",), lifetime=CLIENT_CERT_VALIDITY)
    SCRUBBER.register(talos_cert.key_pem)
    kube_cert = issue_kubernetes_admin_certificate(k8s_signing)
    return Minted(talosconfig(cluster, endpoints, os_trusted, talos_cert),
                  kubeconfig(cluster, server, k8s_trusted, kube_cert, namespace=namespace),
                  certificate_fingerprint(talos_cert.cert_pem), certificate_fingerprint(kube_cert.cert_pem))


# ---- reading a talosconfig back: the dial that uses exactly its credential ------------------


@dataclass(frozen=True, repr=False)
class PinnedDial(DialBundle):
    """A dial bundle whose client certificate is a given one (the talosconfig's), never a minted one."""

    pinned: ClientCertificate | None = field(default=None, repr=False)

    def client_certificate(self) -> ClientCertificate:
        if self.pinned is None:
            raise MintError("a pinned dial needs its client certificate")
        return self.pinned

    @property
    def fingerprint(self) -> str:
        pinned = self.pinned.cert_pem if self.pinned else b""
        return hashlib.sha256(super().fingerprint.encode() + b"\0" + pinned).hexdigest()


def talosconfig_dial(data: bytes, signing_ca: CertificateAuthority) -> tuple[PinnedDial, list[str]]:
    """The dial a talosconfig's current context describes, and its endpoints.

    ``signing_ca`` only satisfies DialBundle (it is never used to sign: the certificate is pinned).
    """
    try:
        doc: Any = yamlio.load(data)
        ctx = doc["contexts"][doc["context"]]
        trusted = _pem.b64_pem_decode(str(ctx["ca"]), "talosconfig ca")
        cert = ClientCertificate(_pem.b64_pem_decode(str(ctx["crt"]), "talosconfig crt"),
                                 _pem.b64_pem_decode(str(ctx["key"]), "talosconfig key"))
        endpoints = [str(e) for e in ctx["endpoints"]]
    except (KeyError, TypeError, ValueError, _pem.PEMError) as exc:
        raise MintError(f"the talosconfig just made cannot be read back ({type(exc).__name__}); "
                        "this is a bug in ichord") from None
    dial = PinnedDial(signing_ca, tuple(_pem.pem_blocks(trusted)), pinned=cert)
    return dial, endpoints
