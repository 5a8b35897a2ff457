"""Connection failures read as host:port and the root cause, without object reprs or "caused by" chains.

The exceptions are the ones aiohttp, ssl, socket and grpclib raise, built as those libraries build them;
the real-wire twins are in tests/integration/test_error_summaries_wire.py.
"""

from __future__ import annotations

import socket
import ssl

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ichord.errors import network_cause
from ichord.kube import errors
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.scrub import Scrubber
from ichord.talos import errors as te
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle


def key(host: str, port: int) -> ConnectionKey:
    return ConnectionKey(host, port, True, ssl.create_default_context(), None, None, None, None)


def refused(host: str = "127.0.0.1", port: int = 6443) -> aiohttp.ClientConnectorError:
    os_error = ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
    exc = aiohttp.ClientConnectorError(key(host, port), os_error)
    exc.__cause__ = os_error
    return exc


def untrusted() -> ssl.SSLCertVerificationError:
    # What _ssl raises for a chain it cannot verify (it sets these attributes on the instance).
    exc = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to "
                                          "get local issuer certificate (_ssl.c:1006)")
    exc.verify_message = "unable to get local issuer certificate"
    exc.verify_code = 20
    exc.reason = "CERTIFICATE_VERIFY_FAILED"
    return exc


def translated(exc: BaseException) -> errors.KubeError:
    """What ``translate()`` raises for ``exc`` (with its cause chained, as there)."""
    with pytest.raises(errors.KubeError) as info, errors.translate():
        raise exc
    return info.value


def test_a_refused_port_is_host_port_and_connection_refused() -> None:
    err = translated(refused())
    assert isinstance(err, errors.Unavailable) and err.retryable
    assert str(err) == "the Kubernetes API server at 127.0.0.1:6443 is unreachable: connection refused"
    # The whole chain stays available for the debug log.
    assert "ConnectionRefusedError" in err.detail and "Connect call failed" in err.detail
    assert isinstance(err.__cause__, aiohttp.ClientConnectorError)


def test_ipv6_host_and_name_not_resolved() -> None:
    assert str(translated(refused("fd00::1", 6443))).startswith("the Kubernetes API server at [fd00::1]:6443 is")
    gai = socket.gaierror(-2, "Name or service not known")
    dns = aiohttp.ClientConnectorDNSError(key("api.example.invalid", 6443), gai)
    assert str(translated(dns)) == ("the Kubernetes API server at api.example.invalid:6443 is unreachable: "
                                    "name not resolved (Name or service not known)")


def test_an_untrusted_certificate_names_the_reason_and_the_fix() -> None:
    cert = aiohttp.ClientConnectorCertificateError(key("127.0.0.1", 6443), untrusted())
    err = translated(cert)
    assert isinstance(err, errors.TLSVerificationError)
    assert str(err) == ("the Kubernetes API server at 127.0.0.1:6443: its certificate is not trusted (unable to "
                        "get local issuer certificate); the trust store must hold the CA that signs it")
    assert network_cause(cert) == "certificate not trusted (unable to get local issuer certificate)"
    bare = translated(untrusted())  # without aiohttp around it the address is not known
    assert str(bare).startswith("the Kubernetes API server: its certificate is not trusted (unable to get local")


@pytest.mark.parametrize(("exc", "cause"), [
    (TimeoutError(), "timed out"),
    (ConnectionResetError(104, "Connection reset by peer"), "connection reset"),
    (OSError(113, "No route to host"), "host unreachable"),
    (aiohttp.ServerDisconnectedError(), "the server closed the connection"),
])
def test_other_transport_failures(exc: BaseException, cause: str) -> None:
    text = str(translated(exc))
    assert cause in text and "0x" not in text and "Error" not in text


def test_no_object_repr_and_no_caused_by_in_what_conditions_show() -> None:
    err = translated(refused())
    # Conditions and Events are built with Scrubber.exception: it stops at the typed error.
    shown = Scrubber().exception(err)
    assert shown == "Unavailable: the Kubernetes API server at 127.0.0.1:6443 is unreachable: connection refused"
    assert "0x" not in shown and "caused by" not in shown and "SSLContext" not in shown
    # The debug form keeps everything, scrubbed.
    whole = Scrubber().chain(err)
    assert whole.count("caused by") >= 1 and "ConnectionRefusedError" in whole


def _outer() -> None:
    try:
        raise ValueError("inner detail")
    except ValueError:
        raise RuntimeError("outer") from None


def test_a_suppressed_context_is_not_followed() -> None:
    with pytest.raises(RuntimeError) as info:
        _outer()
    assert Scrubber().exception(info.value) == "RuntimeError: outer"
    assert "inner detail" in Scrubber().chain(info.value)


# ---- Talos ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
def talos(bundle: SecretsBundle) -> TalosClient:
    return TalosClient(DialBundle.from_bundle(bundle))


def test_talos_connection_failures_are_summarised(talos: TalosClient) -> None:
    endpoint = "127.0.0.12:50000"
    err = talos._translate(ConnectionRefusedError(111, "Connect call failed ('127.0.0.12', 50000)"), endpoint,
                           "Version", None, dialing=True)
    assert isinstance(err, te.TalosUnreachableError)
    assert str(err).startswith("Talos Version on 127.0.0.12:50000 failed: connection refused. Check that")
    err = talos._translate(socket.gaierror(-2, "Name or service not known"), "node.invalid:50000", "Version", None,
                           dialing=True)
    assert "failed: name not resolved (Name or service not known)" in str(err)
    err = talos._translate(untrusted(), endpoint, "Version", None, dialing=True)
    assert isinstance(err, te.TalosCertificateError)
    assert "serving certificate is not trusted: unable to get local issuer certificate" in str(err)
    err = talos._translate(StreamTerminatedError("Connection lost"), endpoint, "Version", None)
    assert isinstance(err, te.TalosUnreachableError) and "connection lost (Connection lost)" in str(err)
    err = talos._translate(ConnectionResetError(104, "Connection reset by peer"), endpoint, "Version", None,
                           fresh=True)
    assert isinstance(err, te.TalosCertificateError) and "(connection reset)" in str(err)


def test_talos_grpc_answers_keep_the_status(talos: TalosClient) -> None:
    err = talos._translate(GRPCError(Status.UNAVAILABLE, "connection error: desc = \"transport: connection refused\""),
                           "127.0.0.11:50000", "Version", "10.5.0.3")
    assert isinstance(err, te.TalosUnreachableError) and err.code == "UNAVAILABLE"
    assert str(err).startswith("Talos Version on 127.0.0.11:50000 (node 10.5.0.3) failed [UNAVAILABLE]: ")
    for text in (str(err), Scrubber().exception(err)):
        assert "0x" not in text and "caused by" not in text
