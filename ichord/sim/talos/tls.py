"""apid's TLS for a simulated node, following the node's running configuration.

Each new connection gets a server context built for the configuration running at that moment:
serving certificate from the issuing OS CA (a control plane signs it itself; a worker asks trustd,
that is the cluster's control plane), client certificates verified against machine.ca +
machine.acceptedCAs. After the handshake the client certificate must carry ExtKeyUsage exactly
[ClientAuth] (apid's verifyExtKeyUsage). Nothing restarts when the configuration changes.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID

from ichord.pki import pem as _pem
from ichord.pki.memfile import load_cert_chain_from_memory
from ichord.sim.talos.certs import sign_leaf
from ichord.sim.talos.client_cas import advertise_client_cas
from ichord.sim.talos.config_view import CAView, ConfigView

#: (issuing CA) for a worker: trustd on a control plane signs its serving certificate.
TrustdIssuer = Callable[[], CAView | None]


class ServingIdentityError(Exception):
    pass


class NodeTLS:
    def __init__(self, ips: list[str], names: list[str], trustd: TrustdIssuer) -> None:
        self.ips = ips
        self.names = names
        self.trustd = trustd
        self._cache: dict[str, tuple[ssl.SSLContext, dict[str, Any]]] = {}
        #: The serving certificate and key by issuing CA: a change of the trusted CAs alone (Accepting,
        #: Dropping) builds a new context around the same certificate instead of signing another.
        self._leaves: dict[bytes, tuple[bytes, bytes]] = {}

    def issuer_for(self, view: ConfigView) -> CAView:
        if view.os_ca.key_pem is not None:
            return view.os_ca
        issuer = self.trustd()
        if issuer is None or issuer.key_pem is None:
            raise ServingIdentityError("no control plane can sign this worker's apid certificate (trustd)")
        return issuer

    def context(self, view: ConfigView) -> tuple[ssl.SSLContext, dict[str, Any]]:
        """The server context for ``view`` and a description of it (issuer and trusted fingerprints)."""
        # Keyed by the configuration only: a worker keeps the certificate trustd gave it until its
        # own configuration changes, as Talos renews it on an OSRoot change.
        key = hashlib.sha256(b"\0".join([view.os_ca.signer_pem, *view.os_trust])).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        issuer = self.issuer_for(view)
        assert issuer.key_pem is not None  # issuer_for returns issuing CAs only
        leaf = self._leaves.get(issuer.signer_pem)
        if leaf is None:
            leaf = sign_leaf(issuer.signer_pem, issuer.key_pem, common_name=self.names[0],
                             ips=[*self.ips, "127.0.0.1"], dns=self.names)
            self._leaves = {issuer.signer_pem: leaf}  # only the current issuer's is kept
        cert, private = leaf
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=b"".join(view.os_trust).decode())
        advertise_client_cas(ctx, view.os_trust)  # apid names the CAs it accepts client certificates from
        ctx.set_alpn_protocols(["h2"])
        load_cert_chain_from_memory(ctx, cert, _pem.to_standard_label(private))
        desc = {"serving_issuer": _short(issuer.signer_pem), "trusted_clients": [_short(c) for c in view.os_trust]}
        self._cache = {key: (ctx, desc)}  # only the current configuration's context is kept
        return ctx, desc


def _short(pem: bytes) -> str:
    return x509.load_pem_x509_certificate(pem).fingerprint(hashes.SHA256()).hex()[:16]


def check_client_certificate(der: bytes | None) -> str | None:
    """apid's ExtKeyUsage rule on the (already chain-verified) client leaf; returns why it is refused."""
    if der is None:
        return "no client certificate"
    cert = x509.load_der_x509_certificate(der)
    try:
        usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return "client certificate has no ExtKeyUsage; apid requires exactly [ClientAuth]"
    if usages != [ExtendedKeyUsageOID.CLIENT_AUTH]:
        names = ", ".join(getattr(u, "_name", u.dotted_string) for u in usages)
        return f"client certificate ExtKeyUsage is [{names}]; apid requires exactly [ClientAuth]"
    return None
