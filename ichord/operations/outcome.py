"""Typed step outcomes (controller-runtime's Result, made explicit).

A step of a cluster actor returns one of these; exactly one place (the actor loop) turns it into
the next wake-up, a metric and a log line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Done:
    """Nothing more to do until something changes."""


@dataclass(frozen=True)
class Requeue:
    """Run again after ``after`` seconds (a wait of minutes is a requeue, never a sleep in a step)."""

    after: float
    reason: str = ""


@dataclass(frozen=True)
class Blocked:
    """Cannot proceed for a reason the user can see; retried after ``retry_after`` seconds."""

    reason: str
    message: str
    retry_after: float


@dataclass(frozen=True)
class Failed:
    """Ended for good (e.g. an invalid spec); only a change of the inputs wakes the actor again."""

    reason: str
    message: str = ""


Outcome = Done | Requeue | Blocked | Failed


def next_delay(outcome: Outcome) -> float | None:
    """Seconds until the actor should run again on its own; None = only on a message."""
    if isinstance(outcome, Requeue):
        return max(0.0, outcome.after)
    if isinstance(outcome, Blocked):
        return max(0.0, outcome.retry_after)
    return None


def earliest(*delays: float | None) -> float | None:
    """The lowest requested delay wins (cluster-api's phase functions)."""
    present = [d for d in delays if d is not None]
    return min(present) if present else None


def soonest(*outcomes: Outcome) -> Outcome:
    """The outcome that asks to run soonest (cluster-api: the lowest requeue wins); when none asks to run again,
    a Failed (it says more) or Done."""
    best: Outcome | None = None
    best_delay: float | None = None
    for outcome in outcomes:
        delay = next_delay(outcome)
        if delay is not None and (best_delay is None or delay < best_delay):
            best, best_delay = outcome, delay
    if best is not None:
        return best
    return next((o for o in outcomes if isinstance(o, Failed)), Done())


def describe(outcome: Outcome) -> tuple[str, str]:
    """(type, reason) of an outcome, for the one log line and counter the actor keeps per phase."""
    reason = outcome.reason if isinstance(outcome, Requeue | Blocked | Failed) else ""
    return type(outcome).__name__, reason
