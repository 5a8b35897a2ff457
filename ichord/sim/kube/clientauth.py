"""Client-certificate authentication like kube-apiserver's: asked for in TLS, judged over HTTP.

Go's kube-apiserver requests a client certificate without verifying it in the handshake
(``tls.RequestClientCert``); its x509 authenticator checks the chain afterwards and answers 401
when it does not lead to a client CA. Python's ``ssl`` cannot request a certificate without having
OpenSSL verify it (a failure would be a handshake alert, not a 401), so the server context gets an
OpenSSL verify callback that defers the decision, and ``ClientCertAuth`` makes it on every request
with ``cryptography``: signature by an accepted CA, validity period, ClientAuth usage.
"""

from __future__ import annotations

import _ssl
import ctypes
import datetime as dt
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord.errors import IchordError
from ichord.pki import pem as _pem

_VERIFY_PEER = 0x01
_VerifyCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def _accept_for_now(_preverify_ok: int, _store: int) -> int:
    # The handshake goes on whatever the chain; ClientCertAuth.check decides per request.
    return 1


#: Kept referenced for the process lifetime: OpenSSL holds the bare function pointer.
_defer_to_application = _VerifyCallback(_accept_for_now)


class ClientAuthUnavailableError(IchordError):
    """This Python's ssl module does not expose the OpenSSL symbols needed to defer verification."""


def request_client_certificates(ctx: ssl.SSLContext) -> None:
    """Make the server ask every client for a certificate and defer its verification to the handler."""
    ctx.verify_mode = ssl.CERT_OPTIONAL  # SSL_VERIFY_PEER without FAIL_IF_NO_PEER_CERT
    try:
        lib = ctypes.CDLL(_ssl.__file__)  # resolves in _ssl's own libssl, the one owning the SSL_CTX
        set_verify = lib.SSL_CTX_set_verify
        get_mode = lib.SSL_CTX_get_verify_mode
    except (OSError, AttributeError) as exc:
        raise ClientAuthUnavailableError(
            f"cannot install a deferred client-certificate check ({exc}); run the simulator on a CPython "
            "whose _ssl links OpenSSL dynamically") from None
    set_verify.argtypes, set_verify.restype = [ctypes.c_void_p, ctypes.c_int, _VerifyCallback], None
    get_mode.argtypes, get_mode.restype = [ctypes.c_void_p], ctypes.c_int
    # CPython's SSLContext object starts with PyObject_HEAD followed by its SSL_CTX pointer.
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr or get_mode(ptr) != _VERIFY_PEER:
        raise ClientAuthUnavailableError("unexpected SSLContext layout; cannot defer client-certificate checks")
    set_verify(ptr, _VERIFY_PEER, _defer_to_application)


@dataclass(frozen=True)
class ClientIdentity:
    user: str
    groups: tuple[str, ...]


class ClientCertRejectedError(IchordError):
    """The client certificate does not authenticate; the message is the reason (no key material)."""


class ClientCertAuth:
    """The CAs whose client certificates are accepted now; replace them with ``set_cas``."""

    def __init__(self, cas: Sequence[bytes]) -> None:
        self.cas: tuple[bytes, ...] = ()
        self._certs: list[x509.Certificate] = []
        self.set_cas(cas)

    def set_cas(self, cas: Sequence[bytes]) -> None:
        blocks: list[bytes] = []
        for pem in cas:
            for block in _pem.pem_blocks(pem):
                if block not in blocks:
                    blocks.append(block)
        self.cas = tuple(blocks)
        self._certs = [_pem.load_certificate(b, "client CA") for b in blocks]

    def check(self, der: bytes, now: dt.datetime | None = None) -> ClientIdentity:
        """The identity of a verified client certificate; ClientCertRejectedError says why not."""
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            raise ClientCertRejectedError("the client certificate cannot be parsed") from None
        now = now or dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise ClientCertRejectedError("x509: certificate has expired or is not yet valid")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = None
        if usages is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
            raise ClientCertRejectedError("x509: certificate specifies an incompatible key usage")
        if not any(self._signed_by(cert, ca) for ca in self._certs):
            raise ClientCertRejectedError("x509: certificate signed by unknown authority")
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        return ClientIdentity(str(cn[0].value) if cn else "", tuple(str(o.value) for o in orgs))

    @staticmethod
    def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True
