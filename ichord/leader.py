"""Lease-based leader election with client-go's semantics (docs/decisions.md#client-restarts on leader election).

- Lease 120 s / renew deadline 90 s / retry 10 s by default (Timing); validated
  LeaseDuration > RenewDeadline > 1.2 x RetryPeriod, so a 60-90 s API outage keeps the lease.
- Every API call runs under max(renew deadline / 2, 1 s). Expiry is judged on this process's
  monotonic clock from when it last saw the Lease change, never by comparing remote timestamps.
- Identity ``<hostname>_<uuid>``; ``leaseTransitions`` counts holder changes; an update carries the
  resourceVersion read, so two candidates never both win.
- Losing the lease cancels the leader's work, runs ``on_stopped_leading`` and raises LeadershipLost
  (``ichord run`` exits non-zero, as controller-runtime does). A voluntary stop releases the Lease,
  only while this process is still the holder and only if the Lease did not change since it was read.
"""

from __future__ import annotations

import datetime as dt
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import structlog

from ichord.errors import IchordError
from ichord.kube.client import KubeClient
from ichord.kube.errors import AlreadyExists, Conflict, KubeError
from ichord.kube.leases import LeaseRecord, create_lease, get_lease, update_lease
from ichord.metrics import LEADER, LEADERLESS_SECONDS, NO_LEADER
from ichord.settings import Timing

log = structlog.get_logger(__name__)

JITTER_FACTOR = 1.2  # client-go's JitterFactor for the acquire retry


class LeaderElectionConfigError(IchordError):
    """The lease timings break client-go's ordering rule."""


class LeadershipLost(IchordError):
    """The Lease could not be renewed within the renew deadline; the process must exit non-zero."""

    exit_code = 1


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class ElectionTiming:
    lease_duration: float
    renew_deadline: float
    retry_period: float
    call_timeout: float

    @classmethod
    def from_timing(cls, timing: Timing) -> ElectionTiming:
        t = cls(timing.lease_duration, timing.renew_deadline, timing.retry_period, timing.lease_call_timeout)
        t.validate()
        return t

    def validate(self) -> None:
        if min(self.lease_duration, self.renew_deadline, self.retry_period) <= 0:
            raise LeaderElectionConfigError("lease duration, renew deadline and retry period must be positive")
        if not self.lease_duration > self.renew_deadline:
            raise LeaderElectionConfigError(
                f"lease duration ({self.lease_duration} s) must be greater than the renew deadline "
                f"({self.renew_deadline} s)")
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise LeaderElectionConfigError(
                f"renew deadline ({self.renew_deadline} s) must be greater than {JITTER_FACTOR} x the retry "
                f"period ({self.retry_period} s)")


class LeaderElector:
    def __init__(self, client: KubeClient, *, namespace: str, name: str = "ichord-leader",
                 identity: str | None = None, timing: Timing | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 rng: random.Random | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = ElectionTiming.from_timing(timing or Timing.from_env())
        self._monotonic = monotonic
        self._wall = wall
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not security)
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        #: When this replica last saw a replica lead (a holder renewing, or its own renewal); from the start on.
        self._led_seen_at = monotonic()
        self.is_leader = False
        LEADERLESS_SECONDS.set_function(self.leaderless_for)
        NO_LEADER.set_function(lambda: 1.0 if self.no_leader() else 0.0)

    def leaderless_for(self) -> float:
        """Seconds since this replica last saw a replica lead: about 0 on the leader, up to the retry period (plus
        its jitter) on a follower while a leader renews; it grows only while nobody renews the Lease."""
        return 0.0 if self.is_leader else max(0.0, self._monotonic() - self._led_seen_at)

    def no_leader(self) -> bool:
        """No replica has led for longer than the Lease lasts: a takeover should have happened by now and did not
        (every replica is failing to reach the API or to write the Lease). ``ichord_no_leader`` and /readyz say it."""
        return self.leaderless_for() > self.timing.lease_duration

    # -- the loop ----------------------------------------------------------------------------
    async def run(self, on_started_leading: Callable[[], Awaitable[None]],
                  on_stopped_leading: Callable[[], None] | None = None,
                  *, release_on_stop: Callable[[], bool] = lambda: True) -> None:
        """Acquire, lead until the work returns or the task is cancelled, then release.

        Raises LeadershipLost when the lease cannot be renewed. ``release_on_stop`` is asked at a
        voluntary stop (False while an etcd restore tail runs, docs/decisions.md#rotation-state).
        """
        await self._acquire()
        lost = crashed = False
        try:
            async with anyio.create_task_group() as tg:
                async def lead() -> None:
                    await on_started_leading()
                    tg.cancel_scope.cancel()  # the work is done: a voluntary stop

                async def renew() -> None:
                    nonlocal lost
                    await self._renew_loop()
                    lost = True
                    tg.cancel_scope.cancel()

                tg.start_soon(renew)
                tg.start_soon(lead)
        except Exception:
            crashed = True  # a crash is not a voluntary stop: the lease runs out
            raise
        finally:
            self._set_leader(False)
            if lost:
                log.error("leader election lost", lease=self.name, identity=self.identity)
            elif not crashed:
                with anyio.CancelScope(shield=True):
                    if release_on_stop():
                        await self.release()
            if on_stopped_leading is not None:
                on_stopped_leading()
        if lost:
            raise LeadershipLost(f"lost the leader Lease {self.namespace}/{self.name}: it could not be renewed "
                                 f"within {self.timing.renew_deadline:g} s; exiting so a fresh process can "
                                 f"compete again")

    async def _acquire(self) -> None:
        while True:
            if await self._attempt():
                log.info("became leader", lease=self.name, identity=self.identity)
                self._set_leader(True)
                return
            await anyio.sleep(self.timing.retry_period * (1 + JITTER_FACTOR * self._rng.random()))

    async def _renew_loop(self) -> None:
        """Returns only when leadership is lost."""
        while True:
            await anyio.sleep(self.timing.retry_period)
            start = self._monotonic()
            while True:
                remaining = self.timing.renew_deadline - (self._monotonic() - start)
                if remaining <= 0:
                    return
                if await self._attempt(min(self.timing.call_timeout, remaining)):
                    break
                remaining = self.timing.renew_deadline - (self._monotonic() - start)
                await anyio.sleep(max(0.0, min(self.timing.retry_period, remaining)))

    # -- one try, client-go's tryAcquireOrRenew -------------------------------------------------------
    async def _attempt(self, bound: float | None = None) -> bool:
        try:
            with anyio.fail_after(bound or self.timing.call_timeout):
                ok = await self._try_acquire_or_renew()
        except (KubeError, TimeoutError) as exc:
            log.warning("lease attempt failed", lease=self.name, error=str(exc) or type(exc).__name__)
            ok = False
        return ok

    async def _try_acquire_or_renew(self) -> bool:
        now_wall = self._wall()
        if await self._renew_as_observed(now_wall):
            return True
        current = await get_lease(self.client, self.namespace, self.name)
        if current is None:
            record = LeaseRecord(self.identity, _seconds(self.timing.lease_duration), now_wall, now_wall, 0)
            try:
                created = await create_lease(self.client, self.namespace, self.name, record)
            except AlreadyExists:
                return False
            self._observe(created)
            return True
        if self._observed is None or _content(current) != _content(self._observed):
            self._observed_at = self._monotonic()
            if current.holder:
                self._led_seen_at = self._observed_at  # a holder renewed (or took) it: someone leads
        self._observed = current
        held_by_other = bool(current.holder) and current.holder != self.identity
        if held_by_other and self._observed_at + current.duration_seconds * self._scale() > self._monotonic():
            return False
        if current.holder == self.identity:
            record = current.with_(renew_time=now_wall, duration_seconds=_seconds(self.timing.lease_duration))
        else:
            record = current.with_(holder=self.identity, acquire_time=now_wall, renew_time=now_wall,
                                   duration_seconds=_seconds(self.timing.lease_duration),
                                   transitions=current.transitions + 1)
        try:
            updated = await update_lease(self.client, self.namespace, self.name, record)
        except Conflict:
            return False
        self._observe(updated)
        return True

    async def _renew_as_observed(self, now_wall: dt.datetime) -> bool:
        """client-go's fast path: a leader whose Lease is still valid renews the Lease as it last wrote it, one PUT
        and no GET (an idle leader's only requests). The update carries the resourceVersion of that write, so it
        succeeds only if nobody changed the Lease since; on any failure the caller reads the Lease and decides as
        every other attempt does."""
        observed = self._observed
        if (not self.is_leader or observed is None or observed.holder != self.identity
                or self._observed_at + observed.duration_seconds * self._scale() <= self._monotonic()):
            return False
        try:
            updated = await update_lease(self.client, self.namespace, self.name, observed.with_(
                renew_time=now_wall, duration_seconds=_seconds(self.timing.lease_duration)))
        except KubeError as exc:
            log.info("lease renewal as last written failed; reading the lease", lease=self.name,
                     error=str(exc) or type(exc).__name__)
            return False
        self._observe(updated)
        return True

    def _scale(self) -> float:
        # leaseDurationSeconds is whole seconds on the wire; scaled test timings keep their own ratio.
        seconds = _seconds(self.timing.lease_duration)
        return self.timing.lease_duration / seconds

    def _observe(self, record: LeaseRecord) -> None:
        self._observed, self._observed_at = record, self._monotonic()
        self._led_seen_at = self._observed_at  # this replica holds it

    def _set_leader(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            LEADER.set(1 if leading else 0)

    async def release(self) -> bool:
        """Clear the holder if this process still holds the Lease and it did not change since read."""
        try:
            with anyio.fail_after(self.timing.call_timeout):
                current = await get_lease(self.client, self.namespace, self.name)
                if current is None or current.holder != self.identity:
                    return False
                now_wall = self._wall()
                await update_lease(self.client, self.namespace, self.name, current.with_(
                    holder=None, duration_seconds=1, acquire_time=now_wall, renew_time=now_wall))
        except (KubeError, TimeoutError) as exc:
            log.warning("lease not released; it will expire instead", lease=self.name, error=str(exc))
            return False
        log.info("released the leader lease", lease=self.name, identity=self.identity)
        return True


def _seconds(duration: float) -> int:
    return max(1, round(duration))


def _content(record: LeaseRecord) -> tuple[object, ...]:
    return (record.holder, record.duration_seconds, record.acquire_time, record.renew_time, record.transitions)
