"""The one error policy for operation steps (controller-runtime's "one place turns a result into retry").

A step that raises an ``IchordError`` (the management or managed API did not answer, a Talos node is
unreachable, the bundle Secret cannot be read) is retried with exponential backoff: one log line per failed
step, no actor restart. Every step is idempotent and re-derived from the API and the nodes, so repeating one
is always safe. When an operation's steps have failed for longer than ``Timing.step_retry_bound``, its
``StepsFailing`` condition says so (once, with one Warning: now a person should look); the first step that
succeeds again lowers it. An exception that is not an ``IchordError`` is a bug: it still restarts the actor.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import structlog

from ichord.api.conditions import Condition
from ichord.api.names import STEPS_FAILING, EventReason, StepsFailingReason
from ichord.api.views import OperationView
from ichord.errors import IchordError
from ichord.kube.errors import KubeError
from ichord.operations.op_status import Obj, Transition
from ichord.operations.outcome import Requeue
from ichord.operations.scope import ClusterScope
from ichord.pki.scrub import SCRUBBER
from ichord.talos.errors import TalosError

log = structlog.get_logger("ichord.operations")


@dataclass
class _Failing:
    cluster: str
    since: dt.datetime
    steps: int = 0


def backoff(steps: int, initial: float, maximum: float) -> float:
    """Seconds before retrying after the ``steps``-th consecutive failed step: initial, 2x, 4x, ... up to maximum."""
    return float(min(maximum, initial * 2.0 ** max(0, steps - 1)))


@dataclass
class StepRetries:
    """Consecutive failed steps per operation (by UID), kept in memory: a restarted or new leader starts the count
    afresh, which only delays the condition, never a retry."""

    _failing: dict[str, _Failing] = field(default_factory=dict)

    async def failed(self, scope: ClusterScope, op: OperationView, exc: IchordError) -> Requeue:
        """The step of ``op`` raised ``exc``: log it once, raise the condition past the bound, back off."""
        now = scope.now()
        failing = self._failing.setdefault(op.uid, _Failing(scope.key, since=now))
        failing.steps += 1
        timing = scope.timing
        delay = backoff(failing.steps, timing.step_retry_initial, timing.step_retry_max)
        error = SCRUBBER.exception(exc)
        log.warning("operation step failed; retrying", cluster=scope.key, operation=f"{op.namespace}/{op.name}",
                    kind=op.kind, failed_steps=failing.steps, retry_in=round(delay, 3), error=error)
        failing_for = (now - failing.since).total_seconds()
        if failing_for >= timing.step_retry_bound:
            await _raise_condition(scope, op, exc, failing.steps, failing.since)
        return Requeue(delay, "step failed")

    async def succeeded(self, scope: ClusterScope, op: OperationView) -> None:
        """A step of ``op`` ran: forget its failures and lower the condition if it was raised."""
        self._failing.pop(op.uid, None)
        current = op.condition(STEPS_FAILING)
        if current is None or current.get("status") != "True":
            return
        await scope.transition(op, Transition(Condition(STEPS_FAILING, "False", StepsFailingReason.RECOVERED,
                                                        "steps run again"), generation=True, said=_lowered))

    def keep_only(self, scope: ClusterScope) -> None:
        """Drop the counts of the cluster's operations that are gone."""
        live = {op.uid for op in scope.operations}
        for uid in [u for u, f in self._failing.items() if f.cluster == scope.key and u not in live]:
            del self._failing[uid]


def _reason(exc: IchordError) -> str:
    if isinstance(exc, KubeError):
        return StepsFailingReason.API_ERROR
    if isinstance(exc, TalosError):
        return StepsFailingReason.TALOS_ERROR
    return StepsFailingReason.STEP_ERROR


async def _raise_condition(scope: ClusterScope, op: OperationView, exc: IchordError, steps: int,
                           since: dt.datetime) -> None:
    current = op.condition(STEPS_FAILING)
    if current is not None and current.get("status") == "True":
        return  # raised already this episode: one Warning, no write per retry
    reason = _reason(exc)
    message = (f"{steps} steps in a row failed since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}: "
               f"{SCRUBBER.text(str(exc))}; ichord keeps retrying. Check that the API or node it names answers")
    # The API that fails the steps may fail this write too: the next retry tries again.
    await scope.transition(op, Transition(Condition(STEPS_FAILING, "True", reason, message),
                                          event=("Warning", EventReason.STEPS_FAILING), generation=True,
                                          said=_raised))


def _raised(_cond: Condition, before: Obj | None) -> bool:
    """Raised already this episode (as the object reads now): one Warning, no write per retry."""
    return before is not None and before.get("status") == "True"


def _lowered(cond: Condition, before: Obj | None) -> bool:
    return not _raised(cond, before)
