"""status.progress of every operation kind: steps done of the total, and an ETA from the duration model.

The steps are the kind's (``KindDescription.steps``: a config rollout's planned machines, a ca-rotation's planned
stages); what each costs comes from the model the rehearsal uses (``DEFAULTS``, docs/architecture.md#rehearsal).
The ETA is the model's cost of the steps left, scaled by what this run has shown so far: the time since
status.startedAt over the model's cost of the steps done (before the first step is done, the model alone).

Written by the backbone's one status writer, inside the write a step makes anyway (operations/backbone.py): never a
write of its own. Times are the step's clock, as every other time the step writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ichord.api.conditions import now_rfc3339, parse_time
from ichord.api.operation_kinds import DONE_STAGE, KindDescription, Step

Obj = dict[str, Any]

#: Step kind -> (low, high) seconds on a real cluster, and what it covers. Defaults: Talos on VMs or bare metal.
DEFAULTS: dict[str, tuple[float, float, str]] = {
    "apply": (1.0, 5.0, "one ApplyConfiguration, dry run and write"),
    "reboot": (60.0, 240.0, "a reboot, down to Talos answering and the Node Ready again"),
    "apiserver_restart": (15.0, 60.0, "a kube-apiserver restart to /readyz ok"),
    "drain": (10.0, 120.0, "cordon and evict a node's pods, each replacement Ready"),
    "stage": (5.0, 30.0, "a stage's own checks and settling (clients restarted, Secrets republished)"),
}


def cost(step: Step) -> float:
    """The model's seconds for ``step``: the middle of each of its kinds' range."""
    return sum((DEFAULTS[k][0] + DEFAULTS[k][1]) / 2 for k in step.costs if k in DEFAULTS)


def remaining_seconds(steps: Sequence[Step], elapsed: float | None) -> float:
    """The model's cost of the steps left, scaled by this run's pace on the steps done (``elapsed``: seconds since
    the start; None: not started, the model alone)."""
    left = sum(cost(s) for s in steps if not s.done)
    spent = sum(cost(s) for s in steps if s.done)
    if elapsed is None or spent <= 0:
        return left
    return left * (max(0.0, elapsed) / spent)


def note_progress(kind: KindDescription, status: Obj, now: dt.datetime) -> None:
    """Set status.progress ({done, total, steps: "done/total", eta}) from ``status`` as about to be written. The
    ETA is removed (None: the merge patch drops it) once nothing is left or before the start."""
    steps = kind.steps(status)
    if not steps:
        return
    done = sum(1 for s in steps if s.done)
    started = status.get("startedAt")
    elapsed: float | None = None
    if started:
        try:
            elapsed = (now - parse_time(str(started))).total_seconds()
        except ValueError:
            elapsed = None
    finished = done == len(steps) or kind.stage_in(status) == DONE_STAGE
    eta = None if finished or not started else now_rfc3339(now + dt.timedelta(
        seconds=remaining_seconds(steps, elapsed)))
    status["progress"] = {"done": done, "total": len(steps), "steps": f"{done}/{len(steps)}", "eta": eta}
