"""The trust pool and the per-replica trust sync (ADR 0063 trust amendments).

The process has one pool (``installed()``), installed by ``ichord run``. ``rotation_trust_hook`` is
the ca-rotation's ``RotationContext.trust_hook``: the leader adds the new Kubernetes CA and
publishes it on every pass that reads rotation.yaml. Without an installed pool (the pool is off,
or a test drives the rotation in-process) the hook does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from ichord.trust.pool import DEFAULT_TRUST_FILE, TrustPool, TrustPoolError

__all__ = ["DEFAULT_TRUST_FILE", "SharedTrust", "TrustPool", "TrustPoolError", "install", "installed",
           "rotation_trust_hook", "uninstall"]

log = structlog.get_logger("ichord.trust")


@dataclass
class SharedTrust:
    pool: TrustPool
    #: Where the extras are published (the emptyDir file); None keeps them in memory only.
    trust_file: Path | None


class _Slot:
    shared: SharedTrust | None = None


_slot = _Slot()


def install(pool: TrustPool, trust_file: str | Path | None) -> SharedTrust:
    _slot.shared = SharedTrust(pool, Path(trust_file) if trust_file is not None else None)
    return _slot.shared


def uninstall() -> None:
    _slot.shared = None


def installed() -> SharedTrust | None:
    return _slot.shared


def rotation_trust_hook(cert_pem: bytes) -> None:
    """Trust the rotation's new Kubernetes CA and publish it; a failure is logged and never stops the rotation."""
    shared = _slot.shared
    if shared is None:
        return
    try:
        shared.pool.add(cert_pem)
        shared.pool.publish(shared.trust_file)
    except TrustPoolError as exc:
        log.error("the rotation handed over something the trust pool refuses", error=str(exc))
    except OSError as exc:
        log.warning("cannot publish the trust file; the running process trusts the new CA, a restarted "
                    "container will not until the next pass", path=str(shared.trust_file),
                    error=exc.strerror or type(exc).__name__)
