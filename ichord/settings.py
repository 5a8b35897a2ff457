"""Every duration the daemon waits, in one place, with one scale factor.

``ICHORD_TIME_SCALE`` (e.g. ``0.01``) shrinks every duration of the world (leases, retries, settles, the
bounds on waiting for nodes) so the demo and the tests run the real logic fast. It never shrinks the bound on
one API request: how long a request takes on the wire is the machine's, not the world's, and a scaled one
(60 ms at 0.002) fails calls on a loaded machine. Add a field here for every new wait; never hard-code a
duration elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ichord.api.max_unavailable import DEFAULT as DEFAULT_MAX_UNAVAILABLE
from ichord.api.max_unavailable import MaxUnavailable, MaxUnavailableError
from ichord.errors import IchordError


class SettingsError(IchordError):
    """A setting is malformed or inconsistent."""


#: Deprecated alias of ICHORD_MAX_UNAVAILABLE (a count of workers; ``ichord run`` warns when it is used).
DEPRECATED_CONCURRENCY_ENV = "ICHORD_CA_WORKER_APPLY_CONCURRENCY"

#: Fields of Timing that are counts, not durations: ``scaled`` leaves them alone.
_NOT_DURATIONS = frozenset({"max_unavailable"})
#: Fields of Timing that bound one request on the wire, not a duration of the world: ``scaled`` leaves them
#: alone too (a scaled Timing compresses leases and waits; the API server answers no faster for it).
_CALL_BOUNDS = frozenset({"kube_request_timeout", "min_call_timeout"})


@dataclass(frozen=True)
class Timing:
    """Durations in seconds, unscaled defaults; ``scaled(f)`` multiplies every one of them but the bounds on one
    API request (_CALL_BOUNDS)."""

    # Leader election (docs/decisions.md#rotation-state).
    lease_duration: float = 120.0
    renew_deadline: float = 90.0
    retry_period: float = 10.0
    # The cluster lock Lease (the CRDs): held by a running operation, renewed every step.
    cluster_lock_duration: float = 300.0
    # Kubernetes requests: every call finishes well inside the renew deadline. Never scaled (_CALL_BOUNDS).
    # min_call_timeout is the floor of the per-call bound, client-go's max(renew deadline / 2, floor): it binds
    # only when the renew deadline is under 10 s, which only a scaled Timing (the tests, the demo) has; 5 s, not
    # client-go's 1 s, so a loaded machine's slow answer is not a failed call there. The elector still caps each
    # renewal by what is left of its renew deadline (leader.py), so a lease is never held past it.
    kube_request_timeout: float = 30.0
    min_call_timeout: float = 5.0
    # Informers: watch timeoutSeconds (jittered up to +50%), client-side inactivity timeout
    # (bookmarks arrive about every minute), and the backoff after a failed list or watch.
    watch_timeout: float = 300.0
    watch_inactivity_timeout: float = 70.0
    watch_backoff_initial: float = 0.8
    watch_backoff_max: float = 30.0
    # Operations (docs/decisions.md's vocabulary).
    retry: float = 30.0
    # A step that raised (an API or node did not answer) is retried after step_retry_initial, doubling up to
    # step_retry_max; failing for longer than step_retry_bound raises the operation's StepsFailing condition.
    step_retry_initial: float = 1.0
    step_retry_max: float = 10.0
    step_retry_bound: float = 300.0
    settle: float = 120.0
    reboot_retry: float = 300.0
    node_action_timeout: float = 1200.0
    # How often a reboot roll looks again at a node it asked to reboot (a Requeue, never a sleep).
    reboot_poll: float = 10.0
    drain_bound: float = 600.0
    # What a node's step (cordon to uncordon) is taken to last, inside a maintenance window, before this run or the
    # cluster's past operations have timed one (docs/maintenance-windows.md): a reboot at its quickest.
    node_step_estimate: float = 60.0
    # config rollout, API-server-restart class (docs/decisions.md#apiserver-restart): an unchanged container after this
    # long counts as not restarted (a change that left the pod alone); past the bound the step pauses.
    apiserver_restart_unchanged: float = 60.0
    apiserver_restart_bound: float = 180.0
    trust_sync_tick: float = 10.0
    # CA rotation (docs/decisions.md#client-restarts): the settle after kube-root-ca.crt carries the new CA, the
    # continuous Ready time of every Node before the first client restart, and the restart bound.
    ca_client_settle_delay: float = 120.0
    ca_kubelet_settle_delay: float = 90.0
    ca_client_restart_timeout: float = 300.0
    # How long after a pass applied before it is verified (the kubelet restart a CA change causes has begun).
    ca_pass_verify_delay: float = 5.0
    # How long a pass may wait for its machines to answer and its Nodes to be Ready again (a normal wait,
    # phase InProgress) before the stage is held as Blocked (phase Paused, a Warning Event): issue 12.
    ca_pass_wait_bound: float = 300.0
    # One kube-apiserver restart at a time (docs/decisions.md#ca-rotation-passes, docs/decisions.md#config-rollout): a
    # container unchanged this long after the apply counts as not restarted; past the bound a control plane's restart
    # holds the stage (Blocked).
    ca_apiserver_unchanged: float = 60.0
    ca_apiserver_ready_bound: float = 180.0
    # A cluster actor that will not step again for this long closes its Talos channels (each holds ~0.3 MiB
    # and an fd per machine at idle); the next step dials again (one TLS handshake per machine).
    talos_channel_keep: float = 60.0
    # Not a duration (never scaled): the daemon's maxUnavailable (`ichord run --max-unavailable`,
    # ICHORD_MAX_UNAVAILABLE), the workers a ca-rotation pass or a config rollout changes at once when neither
    # the operation nor its TalosCluster says (api/max_unavailable.py). Carried here so it reaches every step.
    max_unavailable: MaxUnavailable = DEFAULT_MAX_UNAVAILABLE
    # The start-up API wait (docs/decisions.md#rotation-state): give up after
    # api_wait_timeout, probe every api_wait_probe, log a failed probe at most every api_wait_log_interval.
    api_wait_timeout: float = 300.0
    api_wait_probe: float = 1.0
    api_wait_log_interval: float = 15.0
    # /readyz fails once every request has failed to reach or verify the API server for this long (a restart
    # of the API server takes seconds; a CA the client does not trust lasts until something changes).
    api_unready_grace: float = 30.0
    # How often a converged machine's node is read again to catch drift made behind ichord's back.
    drift_resync: float = 300.0
    # CA expiry (docs/decisions.md#expiry-alerting): the bundle is re-read hourly; an unreadable one after 5 minutes.
    expiry_reread: float = 3600.0
    expiry_retry: float = 300.0

    def scaled(self, factor: float) -> Timing:
        if factor <= 0:
            raise SettingsError(f"time scale must be positive, got {factor}")
        return replace(self, **{f.name: getattr(self, f.name) * factor for f in fields(self)
                                if f.name not in _NOT_DURATIONS | _CALL_BOUNDS})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Timing:
        """Defaults scaled by ``ICHORD_TIME_SCALE`` (1 when unset); ``ICHORD_MAX_UNAVAILABLE`` (else its deprecated
        alias ``ICHORD_CA_WORKER_APPLY_CONCURRENCY``) as the daemon's maxUnavailable."""
        env = os.environ if environ is None else environ
        timing = cls()
        raw = env.get("ICHORD_TIME_SCALE", "").strip()
        if raw:
            try:
                factor = float(raw)
            except ValueError:
                raise SettingsError(f"ICHORD_TIME_SCALE must be a number such as 0.01, got {raw!r}") from None
            timing = timing.scaled(factor)
        raw, name = env.get("ICHORD_MAX_UNAVAILABLE", "").strip(), "ICHORD_MAX_UNAVAILABLE"
        if not raw:  # the deprecated spelling of a whole number of workers (before issue 19)
            raw, name = env.get(DEPRECATED_CONCURRENCY_ENV, "").strip(), DEPRECATED_CONCURRENCY_ENV
        if raw:
            try:
                timing = replace(timing, max_unavailable=MaxUnavailable.parse_text(raw, field=name))
            except MaxUnavailableError as exc:
                raise SettingsError(str(exc)) from None
        return timing

    @property
    def kube_call_timeout(self) -> float:
        """The bound on any single API call: below the renew deadline (client-go's max(renew/2, 1 s)); 5 s when
        the renew deadline is under 10 s (a scaled Timing: min_call_timeout)."""
        return min(self.kube_request_timeout, self.lease_call_timeout)

    @property
    def lease_call_timeout(self) -> float:
        """client-go's bound on each leader-election call: max(renew deadline / 2, floor), our floor 5 s."""
        return max(self.renew_deadline / 2, self.min_call_timeout)
