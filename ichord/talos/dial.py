"""Dial bundles: the credentials of one connection to the Talos API (docs/decisions.md#rotation-state).

A dial bundle names the OS CA that signs the client certificate and every OS CA the node may serve
from. A fresh client certificate (``os:admin`` by default) is minted from the signing CA for each
TLS context, so nothing long-lived leaves the secrets bundle. The server is always verified against
the trust list, by IP or host name.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CertificateAuthority, ClientCertificate, issue_talos_client_certificate
from ichord.pki.memfile import load_cert_chain_from_memory


class DialBundleError(IchordError):
    pass


@dataclass(frozen=True)
class DialBundle:
    """Signing OS CA (with its key) + the OS CAs trusted to serve + the roles of minted certificates."""

    signing_ca: CertificateAuthority = field(repr=False)
    trusted_cas: tuple[bytes, ...] = field(repr=False)
    roles: tuple[str, ...] = ("os:admin",)

    def __post_init__(self) -> None:
        if self.signing_ca.key_pem is None:
            raise DialBundleError("the signing OS CA of a dial bundle needs its private key")
        if not self.trusted_cas:
            raise DialBundleError("a dial bundle needs at least one trusted OS CA certificate")
        for i, ca in enumerate(self.trusted_cas):
            _pem.load_certificate(ca, f"trusted OS CA {i + 1}")

    @classmethod
    def from_bundle(cls, bundle: SecretsBundle, *, also_trust: Sequence[bytes] = (),
                    roles: Sequence[str] = ("os:admin",)) -> DialBundle:
        """The plain bundle: sign with its OS CA and trust it (plus ``also_trust`` during a rotation)."""
        return cls.of(bundle.os, [bundle.os.cert_pem, *also_trust], roles=roles)

    @classmethod
    def of(cls, signing_ca: CertificateAuthority, trusted: Sequence[bytes],
           roles: Sequence[str] = ("os:admin",)) -> DialBundle:
        seen: list[bytes] = []
        for ca in trusted:
            for block in _pem.pem_blocks(ca):
                if block not in seen:
                    seen.append(block)
        return cls(signing_ca, tuple(seen), tuple(roles))

    @property
    def fingerprint(self) -> str:
        """Identifies the credentials (public parts only), for caching channels per credentials."""
        h = hashlib.sha256(self.signing_ca.cert_pem)
        for ca in self.trusted_cas:
            h.update(b"\0" + ca)
        h.update(b"\0" + ",".join(self.roles).encode())
        return h.hexdigest()

    def client_certificate(self) -> ClientCertificate:
        return issue_talos_client_certificate(self.signing_ca, self.roles)

    def ssl_context(self, client_cert: ClientCertificate | None = None) -> ssl.SSLContext:
        """A client context: TLS >= 1.2, ALPN h2, server verified (chain and host name) against the trust list."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=b"".join(self.trusted_cas).decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2"])
        cert = client_cert or self.client_certificate()
        load_cert_chain_from_memory(ctx, cert.cert_pem, _pem.to_standard_label(cert.key_pem))
        return ctx

    def __repr__(self) -> str:
        return f"DialBundle(roles={self.roles!r}, trusted={len(self.trusted_cas)}, fp={self.fingerprint[:12]})"
