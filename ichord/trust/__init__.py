"""The trust pool and the per-replica trust sync (ADR 0063 trust amendments).

The process has one pool (``installed()``), installed by ``ichord run``. ``rotation_trust_hook`` is
the ca-rotation's ``RotationContext.trust_hook``: the leader adds the new Kubernetes CA and
publishes it on every pass that reads rotation.yaml, when the rotation is of its own cluster.
Without an installed pool (the pool is off, or a test drives the rotation in-process) the hook does
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from ichord.trust.pool import DEFAULT_TRUST_FILE, TrustPool, TrustPoolError

__all__ = ["DEFAULT_TRUST_FILE", "SharedTrust", "TrustPool", "TrustPoolError", "install", "installed",
           "rotation_refusal", "rotation_trust_hook", "uninstall"]

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


def rotation_refusal(current_ca_pem: bytes) -> str | None:
    """Why a rotation of the Kubernetes CA ``current_ca_pem`` must not start, or None.

    With the pool installed but no base CA (a kubeconfig naming no certificate-authority), the pool cannot
    tell whether the cluster is the one this process talks to, nor trust its new CA before Issuing: refuse
    rather than lock ichord out mid-way. ``--no-trust-pool`` (nothing installed) is the operator's explicit
    choice and is not refused; it was warned about at start-up.
    """
    shared = _slot.shared
    if shared is None or shared.pool.has_base:
        return None
    del current_ca_pem  # without a base there is nothing to compare it with
    return ("ichord's trust pool has no base CA (" + shared.pool.base_description + "), so it cannot trust the new "
            "Kubernetes CA before Issuing and might lock itself out; run ichord with a kubeconfig that names the "
            "API server's CA (certificate-authority or certificate-authority-data) or with --ca-file")


def rotation_trust_hook(new_ca_pem: bytes, current_ca_pem: bytes) -> None:
    """Trust the rotation's new Kubernetes CA and publish it; a failure is logged and never stops the rotation.

    Only for the cluster whose API server this process talks to (its ca.crt holds the cluster's current
    or new CA): another cluster's CA would never reach the base, so the pool could never drop it.
    """
    shared = _slot.shared
    if shared is None:
        return
    try:
        if not shared.pool.trusts_any([current_ca_pem, new_ca_pem]):
            return
        shared.pool.add(new_ca_pem)
        shared.pool.publish(shared.trust_file)
    except TrustPoolError as exc:
        log.error("the rotation handed over something the trust pool refuses", error=str(exc))
    except OSError as exc:
        log.warning("cannot publish the trust file; the running process trusts the new CA, a restarted "
                    "container will not until the next pass", path=str(shared.trust_file),
                    error=exc.strerror or type(exc).__name__)
