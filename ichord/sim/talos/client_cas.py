"""The CAs a simulated node's TLS server names in its CertificateRequest, as apid's Go TLS stack names its
ClientCAs: a client (Go's GetClientCertificate, curl, openssl s_client) sees which CAs it may present a
certificate from.

Python's ssl module has no call for OpenSSL's client CA list, so this one is reached through ctypes: the
SSLContext's SSL_CTX pointer (the first field after the object header of CPython's PySSLContext) and
libssl's SSL_CTX_add_client_CA, from the library the ssl module itself is linked with. The pointer is
checked first (the verify mode OpenSSL reports must be the context's); when anything does not match, the
context is left as it is and nothing is advertised, as before.
"""

from __future__ import annotations

import _ssl
import ctypes
import ssl
import sys
from collections.abc import Sequence

# OpenSSL's SSL_VERIFY_* for each ssl mode (read to keep the context's own mode; nothing is switched off).
_VERIFY_MODES = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}  # negative


def _libssl() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(_ssl.__file__)
        lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
        lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
        lib.SSL_CTX_add_client_CA.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.SSL_CTX_add_client_CA.restype = ctypes.c_int
        lib.BIO_new_mem_buf.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.BIO_new_mem_buf.restype = ctypes.c_void_p
        lib.BIO_free.argtypes = [ctypes.c_void_p]
        lib.PEM_read_bio_X509.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.PEM_read_bio_X509.restype = ctypes.c_void_p
        lib.X509_free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return lib


_LIB = _libssl() if sys.implementation.name == "cpython" else None


def advertise_client_cas(ctx: ssl.SSLContext, cas: Sequence[bytes]) -> bool:
    """Name ``cas`` (PEM certificates) in ``ctx``'s CertificateRequest; False when it cannot be done here."""
    if _LIB is None:
        return False
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not pointer or _LIB.SSL_CTX_get_verify_mode(pointer) != _VERIFY_MODES.get(ctx.verify_mode):
        return False
    for pem in cas:
        bio = _LIB.BIO_new_mem_buf(pem, len(pem))
        if not bio:
            return False
        try:
            cert = _LIB.PEM_read_bio_X509(bio, None, None, None)
        finally:
            _LIB.BIO_free(bio)
        if not cert:
            return False
        try:
            if _LIB.SSL_CTX_add_client_CA(pointer, cert) != 1:
                return False
        finally:
            _LIB.X509_free(cert)
    return True
