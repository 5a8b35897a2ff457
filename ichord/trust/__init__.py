"""The trust pool and the per-replica trust sync (docs/decisions.md#trust-pool).

``ichord run`` builds one pool and one ``SharedTrust`` (the pool and where its extras are published) and hands
its hooks to the cluster actors through their Runtime (``SharedTrust.hooks()``), never through a global: the
leader adds the new Kubernetes CA and publishes it on every pass that reads rotation.yaml, when the rotation
is of its own cluster. Without a pool (``--no-trust-pool``, or a test driving a rotation in-process) the
hooks do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from ichord.operations.scope import TrustHooks
from ichord.trust.pool import DEFAULT_TRUST_FILE, TrustPool, TrustPoolError

__all__ = ["DEFAULT_TRUST_FILE", "SharedTrust", "TrustPool", "TrustPoolError"]

log = structlog.get_logger("ichord.trust")


@dataclass
class SharedTrust:
    pool: TrustPool
    #: Where the extras are published (the emptyDir file); None keeps them in memory only.
    trust_file: Path | None

    def hooks(self) -> TrustHooks:
        return TrustHooks(trust=self.rotation_trust_hook, refusal=self.rotation_refusal, own_cluster=self.own_cluster)

    def own_cluster(self, ca_pem: bytes) -> bool:
        """True when ``ca_pem`` is the Kubernetes CA (current or new) of the API server this process talks to."""
        return self.pool.trusts_any([ca_pem])

    def rotation_trust_hook(self, new_ca_pem: bytes, current_ca_pem: bytes) -> None:
        """Trust the rotation's new Kubernetes CA and publish it; a failure is logged, never stops the rotation.

        Only for the cluster whose API server this process talks to (its base holds the cluster's current or new
        CA): another cluster's CA would never reach the base, so the pool could never drop it.
        """
        try:
            if not self.pool.trusts_any([current_ca_pem, new_ca_pem]):
                return
            self.pool.add(new_ca_pem)
            self.pool.publish(self.trust_file)
        except TrustPoolError as exc:
            log.error("the rotation handed over something the trust pool refuses", error=str(exc))
        except OSError as exc:
            log.warning("cannot publish the trust file; the running process trusts the new CA, a restarted "
                        "container will not until the next pass", path=str(self.trust_file),
                        error=exc.strerror or type(exc).__name__)

    def rotation_refusal(self, current_ca_pem: bytes) -> str | None:
        """Why a rotation of the Kubernetes CA ``current_ca_pem`` must not start, or None.

        With no base CA (a kubeconfig naming no certificate-authority) the pool cannot tell whether the cluster
        is the one this process talks to, nor trust its new CA before Issuing: refuse rather than lock ichord
        out mid-way. ``--no-trust-pool`` (no SharedTrust at all) is the operator's explicit, warned-about choice.
        """
        if self.pool.has_base:
            return None
        del current_ca_pem  # without a base there is nothing to compare it with
        return ("ichord's trust pool has no base CA (" + self.pool.base_description + "), so it cannot trust the "
                "new Kubernetes CA before Issuing and might lock itself out; run ichord with a kubeconfig that names "
                "the API server's CA (certificate-authority or certificate-authority-data) or with --ca-file")
