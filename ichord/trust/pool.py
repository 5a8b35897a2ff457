"""The trust pool: what ichord's own Kubernetes client trusts (docs/decisions.md#trust-pool).

One pool per process: the base CA file (the pod's projected ``ca.crt``, re-read on every request so
the kubelet's refresh is seen on the next connection) plus extra CA certificates added at runtime:
the new Kubernetes CA of a rotation under way, so the client trusts the API server's certificate
before the serving CA switches at Issuing. The extras are written to a file on an emptyDir
(``publish``) and read back at start-up (``load``), so a restarted container trusts them at once.

Only the trusted set varies: the client still verifies the chain and the host name or IP normally.
The pool holds certificates only; anything else (a private key above all) is refused by ``add``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ichord.errors import IchordError
from ichord.metrics import TRUST_EXTRA_CAS
from ichord.pki import pem as _pem

log = structlog.get_logger("ichord.trust")

#: Where the extras are published in the pod: an emptyDir, so the file outlives a container restart.
DEFAULT_TRUST_FILE = Path("/var/run/ichord/trust/kubernetes-ca.crt")


class TrustPoolError(IchordError):
    """A certificate or trust file the pool cannot use; the message names which and why (never its content)."""


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _certificates(data: bytes, what: str) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle; a block that is not a certificate is refused, never echoed."""
    blocks = _pem.pem_blocks(data)
    if not blocks:
        raise TrustPoolError(f"{what} holds no PEM certificate")
    out = []
    for i, block in enumerate(blocks):
        label = _pem.pem_label(block)
        if label != "CERTIFICATE":
            # Label only: a private key handed here by mistake must not reach a log line.
            raise TrustPoolError(f"{what}: block {i + 1} is a {label}, not a CERTIFICATE; only CA certificates "
                                 f"are trusted (never keys)")
        try:
            cert = x509.load_pem_x509_certificate(block)
        except ValueError:
            raise TrustPoolError(f"{what}: block {i + 1} is not a valid X.509 certificate") from None
        out.append(cert)
    return out


def _require_ca(cert: x509.Certificate, what: str) -> None:
    """Only a CA certificate may join the trust set: a leaf there would be a pinned server, not a CA."""
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise TrustPoolError(f"{what}: {cert.subject.rfc4514_string()} is not a CA certificate "
                             f"(basicConstraints CA:TRUE missing)")


def describe(cert: x509.Certificate) -> dict[str, str]:
    """What a log line may say about a trusted certificate: subject and validity only."""
    return {"subject": cert.subject.rfc4514_string(),
            "not_before": cert.not_valid_before_utc.isoformat(),
            "not_after": cert.not_valid_after_utc.isoformat()}


class TrustPool:
    """The base CA file (re-read per request) plus extra CA certificates, in the order they were added.

    ``source`` is a ``ichord.kube.client.TrustSource``. The methods are synchronous and touch only small
    local files, so they run on the event loop between awaits and never interleave.
    """

    def __init__(self, base: str | Path | None = None, *, base_data: bytes | None = None,
                 describe_base: str | None = None) -> None:
        """``base``: a CA file re-read per request; ``base_data``: fixed PEM (a kubeconfig's inline CA)."""
        self.base = Path(base) if base is not None else None
        self._base_data = base_data if base is None else None
        #: Why the base is what it is, for the start-up log line.
        self.base_description = describe_base or (f"the CA file {self.base}" if self.base is not None else "none")
        self._extras: list[x509.Certificate] = []
        self._pems: list[bytes] = []
        self._unpublished: list[x509.Certificate] = []  # added since the last publish: logged by it
        self._base_warned = False

    # ---- what the client trusts ---------------------------------------------------------------

    @property
    def extras(self) -> list[bytes]:
        """The extra CA certificates (PEM), oldest first."""
        return list(self._pems)

    @property
    def newest(self) -> x509.Certificate | None:
        return self._extras[-1] if self._extras else None

    def source(self) -> Sequence[bytes]:
        """The base file as it is on disk now, then the extras (the client's trust, asked per request)."""
        out = []
        base = self._read_base()
        if base is not None:
            out.append(base)
        return [*out, *self._pems]

    @property
    def has_base(self) -> bool:
        return self.base is not None or self._base_data is not None

    def _read_base(self) -> bytes | None:
        if self._base_data is not None:
            return self._base_data
        if self.base is None:
            return None
        try:
            data = self.base.read_bytes()
        except OSError as exc:
            if not self._base_warned:  # once: a missing ca.crt is logged, not every request
                log.warning("cannot read the base CA file; trusting the extra CAs only", path=str(self.base),
                            error=exc.strerror or type(exc).__name__)
                self._base_warned = True
            return None
        self._base_warned = False
        return data

    def base_certificates(self) -> list[x509.Certificate]:
        """The certificates of the base file re-read now; [] when it is missing or unreadable."""
        data = self._read_base()
        if not data:
            return []
        try:
            return _certificates(data, f"base CA file {self.base}")
        except TrustPoolError as exc:
            log.warning("the base CA file is not a certificate bundle", path=str(self.base), error=str(exc))
            return []

    def trusts_any(self, cert_pems: Iterable[bytes]) -> bool:
        """True when the base file (re-read now) or the extras hold one of ``cert_pems`` (certificate equality).

        This is how the pool knows a rotation is of the cluster this process's API server belongs to:
        it already trusts that cluster's current (or new) Kubernetes CA, through ca.crt or, while ca.crt
        lags a previous rotation, through the extras. Another cluster's CA would never reach the base, so
        trusting it could never end. Without a base nothing is the pool's.
        """
        if not self.has_base:
            return False
        known = {_der(c) for c in self.base_certificates()} | {_der(c) for c in self._extras}
        for data in cert_pems:
            try:
                if any(_der(c) in known for c in _certificates(data, "a CA to compare")):
                    return True
            except TrustPoolError:
                continue
        return False

    # ---- changing it --------------------------------------------------------------------------

    def add(self, cert_pem: bytes) -> bool:
        """Trust the CA certificate(s) in ``cert_pem`` too; True when at least one was new.

        Raises TrustPoolError for anything that is not a PEM certificate (a key is refused, unlogged).
        """
        certs = _certificates(cert_pem, "the CA to trust")
        for cert in certs:
            _require_ca(cert, "the CA to trust")
        added = False
        for cert in certs:
            der = _der(cert)
            if any(_der(c) == der for c in self._extras):
                continue
            self._extras.append(cert)
            self._pems.append(_pem.encode_certificate(cert))
            self._unpublished.append(cert)
            added = True
        if added:
            TRUST_EXTRA_CAS.set(len(self._extras))
        return added

    def publish(self, path: str | Path | None) -> bool:
        """Write the extras to ``path`` (atomically); False when nothing was added and the file exists.

        Each certificate newly trusted since the last publish is logged by subject and validity. With
        no path (a kubeconfig run without --trust-file) the extras are trusted in memory only.
        """
        target = Path(path) if path is not None else None
        if not self._unpublished and (target is None or target.exists()):
            return False
        if not self._extras:
            return False  # nothing to publish; clear() removes a stale file
        if target is not None:
            _write_atomically(target, b"".join(self._pems))
        for cert in self._unpublished:
            log.info("trusting an extra Kubernetes CA", path=str(target) if target else None, **describe(cert))
        self._unpublished = []
        return True

    def load(self, path: str | Path) -> int:
        """Trust the CAs a previous container published to ``path``; how many were loaded (0 if no file).

        Called at start-up, before the API wait, so a restarted container trusts the new CA at once.
        A malformed file is logged and ignored: it is only a cache of what the next sync re-publishes.
        """
        target = Path(path)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            log.info("no trust file from a previous container; trusting the base CA file only", path=str(target))
            return 0
        except OSError as exc:
            log.warning("cannot read the trust file; ignoring it", path=str(target),
                        error=exc.strerror or type(exc).__name__)
            return 0
        try:
            certs = _certificates(data, f"trust file {target}") if data.strip() else []
            for cert in certs:
                _require_ca(cert, f"trust file {target}")
        except TrustPoolError as exc:
            log.warning("the trust file is not a certificate bundle; ignoring it", path=str(target), error=str(exc))
            return 0
        for cert in certs:
            self.add(_pem.encode_certificate(cert))
        # What came from the file is on disk already: publishing it again would be a rewrite for nothing.
        on_disk = {_der(c) for c in certs}
        self._unpublished = [c for c in self._unpublished if _der(c) not in on_disk]
        log.info("loaded extra Kubernetes CAs from the trust file", path=str(target), count=len(certs),
                 certificates=[describe(c) for c in certs])
        return len(certs)

    def clear(self, path: str | Path | None) -> None:
        """Drop every extra and remove the trust file (idempotent)."""
        if self._extras:
            log.info("no longer trusting the extra Kubernetes CAs", count=len(self._extras),
                     certificates=[describe(c) for c in self._extras])
        self._extras, self._pems, self._unpublished = [], [], []
        TRUST_EXTRA_CAS.set(0)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()

    def clear_once_base_trusts(self, path: str | Path | None) -> bool:
        """``clear(path)`` only when the base file, re-read now, holds the newest extra; True when cleared.

        The projected ca.crt lags the API server by a minute or more: clearing earlier would lock the
        client out. Until the base carries the newest CA the extras stay, and the next call tries again.
        """
        newest = self.newest
        if newest is None:
            if path is not None and Path(path).exists():
                self.clear(path)  # a stale file with nothing loaded from it: nothing trusts it any more
                return True
            return False
        der = _der(newest)
        if not any(_der(c) == der for c in self.base_certificates()):
            return False
        self.clear(path)
        return True


def _write_atomically(target: Path, data: bytes) -> None:
    """Write then rename, so a reader (a restarting container) never sees half a file; then flush it to disk.

    The flush follows the rename: a restarting container reads the page cache, so the new CA counts from the
    rename on, and an fsync before it (4-8 ms here) delayed every publish. Only a node crash in between can
    leave a torn file, which ``load`` ignores and the next pass publishes again."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), 0o644)  # CA certificates are public
            os.replace(tmp, target)
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
