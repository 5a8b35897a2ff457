"""The cluster actor loop and the supervisor that keeps every actor running.

Loop: wait for a message or the earliest requested wake-up, take the pending set, run one step of
the cluster, record the next wake-up from the step's typed outcome. Steps are short and
re-entrant; everything they decide is re-derived from the API and the nodes, so a restarted actor
(or process) simply runs a step again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Hashable

import anyio
import anyio.abc
import structlog

from ichord import malloc, metrics
from ichord.actors.mailbox import Mailbox
from ichord.operations.outcome import Outcome, earliest, next_delay
from ichord.pki.scrub import SCRUBBER

Messages = dict[Hashable, str]
StepFn = Callable[[Messages], Awaitable[Outcome]]
Clock = Callable[[], float]

log = structlog.get_logger("ichord.actors")


class ClusterActor:
    def __init__(self, key: str, step: StepFn, *, clock: Clock = time.monotonic,
                 limiter: anyio.CapacityLimiter | None = None, on_idle: Callable[[], object] | None = None) -> None:
        self.key = key
        self._limiter = limiter
        self._on_idle = on_idle  # called after a step when no other step of the limiter runs
        self.mailbox = Mailbox()
        self._step = step
        self._clock = clock
        self._requested: float | None = None
        self.steps = 0

    def tell(self, obj: Hashable, reason: str) -> None:
        self.mailbox.put(obj, reason)
        metrics.ACTOR_MAILBOX_DEPTH.set((self.key,), len(self.mailbox))

    def request_wakeup(self, after: float) -> None:
        """From inside a step: run again after ``after`` seconds at the latest (the lowest request wins)."""
        self._requested = earliest(self._requested, after)

    def stop(self) -> None:
        self.mailbox.close()

    def _begin(self, messages: Messages) -> float:
        metrics.ACTOR_MAILBOX_DEPTH.set((self.key,), len(self.mailbox))
        for cause in _causes(messages):
            metrics.ACTOR_STEPS.labels(cause=cause).inc()
        return time.perf_counter()

    async def run(self) -> None:
        wake_at: float | None = self._clock()  # a (re)started actor reconciles once straight away
        while not self.mailbox.closed:
            timeout = math.inf if wake_at is None else max(0.0, wake_at - self._clock())
            messages = await self.mailbox.take(None if math.isinf(timeout) else timeout)
            if self.mailbox.closed:
                return
            self._requested = None
            if self._limiter is not None:
                async with self._limiter:
                    # What was told while this step waited its turn is older than everything the step is about to
                    # read: it is this step's news, not the next step's. Without this, a thousand actors queued
                    # behind the limiter at start-up each stepped twice when the bundle Secrets' first list landed
                    # meanwhile (docs/scaling.md#the-idle-that-was-not).
                    messages.update(self.mailbox.drain())
                    started = self._begin(messages)
                    outcome = await self._step(messages)
            else:
                started = self._begin(messages)
                outcome = await self._step(messages)
            metrics.ACTOR_STEP_DURATION.observe(time.perf_counter() - started)
            if self._on_idle is not None and (self._limiter is None or self._limiter.borrowed_tokens == 0):
                self._on_idle()  # the burst is over: e.g. give freed memory back (ichord.malloc.IdleTrim)
            self.steps += 1
            delay = earliest(next_delay(outcome), self._requested)
            wake_at = None if delay is None else self._clock() + delay


def _causes(messages: Messages) -> set[str]:
    """What woke a step, for ichord_actor_steps_total: the kinds of the objects told, or the timer (no message)."""
    kinds = {str(key[0]) if isinstance(key, tuple) and key else "other" for key in messages}
    return kinds or {"timer"}


class Supervisor:
    """Creates, restarts (with backoff) and stops cluster actors inside one task group."""

    def __init__(
        self,
        task_group: anyio.abc.TaskGroup,
        step_for: Callable[[str, ClusterActor], StepFn],
        *,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        clock: Clock = time.monotonic,
        max_concurrent_steps: int = 16,
        on_idle: Callable[[], object] | None = malloc.IDLE_TRIM.maybe_trim,
    ) -> None:
        self._tg = task_group
        self._on_idle = on_idle
        # A thousand actors woken together (start-up, a resync) must not all step at once: their
        # API calls would time out behind each other and the leader's lease renewal with them.
        self._limiter = anyio.CapacityLimiter(max_concurrent_steps)
        self._step_for = step_for
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._clock = clock
        self.actors: dict[str, ClusterActor] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self.restarts: dict[str, int] = {}

    def ensure(self, key: str) -> ClusterActor:
        actor = self.actors.get(key)
        if actor is not None:
            return actor
        holder: list[ClusterActor] = []

        async def step(messages: Messages) -> Outcome:
            return await self._step_for(key, holder[0])(messages)

        actor = ClusterActor(key, step, clock=self._clock, limiter=self._limiter, on_idle=self._on_idle)
        holder.append(actor)
        self.actors[key] = actor
        scope = anyio.CancelScope()
        self._scopes[key] = scope
        self._tg.start_soon(self._supervise, key, actor, scope, name=f"actor {key}")
        return actor

    def tell(self, key: str, obj: Hashable, reason: str) -> None:
        self.ensure(key).tell(obj, reason)

    def stop(self, key: str) -> None:
        actor = self.actors.pop(key, None)
        scope = self._scopes.pop(key, None)
        if actor is not None:
            actor.stop()
        if scope is not None:
            scope.cancel()
        metrics.ACTOR_MAILBOX_DEPTH.remove((key,))

    async def _supervise(self, key: str, actor: ClusterActor, scope: anyio.CancelScope) -> None:
        backoff = self._backoff_initial
        with scope:
            while not actor.mailbox.closed:
                started = self._clock()
                try:
                    await actor.run()
                    return
                except Exception as exc:  # one actor crashing never stops the process
                    self.restarts[key] = self.restarts.get(key, 0) + 1
                    metrics.ACTOR_RESTARTS.inc()
                    log.error(
                        "actor crashed; restarting", cluster=key, error=SCRUBBER.exception(exc), restart_in=backoff
                    )
                    # A long healthy run resets the backoff.
                    if self._clock() - started > self._backoff_max:
                        backoff = self._backoff_initial
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_max)
