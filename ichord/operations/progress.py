"""status.progress of every operation kind: steps done of the total, how long each took, and an ETA.

The steps are the kind's (``KindDescription.steps``: a config rollout's planned machines, a ca-rotation's planned
stages); what each costs comes from the model the rehearsal uses (``DEFAULTS``, docs/architecture.md#rehearsal).

- ``observed``: per node and kind of step, how long it took in this run (the time from the step before it, or the
  start, to the write that first counts it done; steps counted done together share that time). At most
  ``OBSERVED_MAX`` entries, the latest kept: ``ichord cluster rehearse`` reads them from past operations.
- ``eta``: the cost of the steps left: a kind of step this run has seen takes its observed mean, any other its
  model cost scaled by this run's pace so far (time since status.startedAt over the model's cost of the steps
  done; before the first step is done, the model alone).

Written by the backbone's one status writer, inside the write a step makes anyway (operations/backbone.py): never a
write of its own. Times are the step's clock, as every other time the step writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from ichord.api.conditions import now_rfc3339
from ichord.api.operation_kinds import DONE_STAGE, KindDescription, Step

Obj = dict[str, Any]

#: The most entries status.progress.observed keeps (the latest): the status stays bounded on any cluster size.
OBSERVED_MAX = 100

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


def step_kind(step: Step) -> str:
    """How an observed step is named: its kinds of the model joined (``drain+apply+reboot``, ``stage``)."""
    return "+".join(step.costs)


def _means(entries: Iterable[object]) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Mean seconds of observed entries per kind of step, and per (node, kind of step)."""
    by_kind: dict[str, list[float]] = {}
    by_node: dict[tuple[str, str], list[float]] = {}
    for o in entries:
        if isinstance(o, dict) and isinstance(o.get("seconds"), int | float):
            kind = str(o.get("step") or "")
            by_kind.setdefault(kind, []).append(float(o["seconds"]))
            if o.get("node"):
                by_node.setdefault((str(o["node"]), kind), []).append(float(o["seconds"]))
    return ({k: sum(v) / len(v) for k, v in by_kind.items()},
            {k: sum(v) / len(v) for k, v in by_node.items()})


def history_of(operations: Iterable[Obj], uid: str) -> list[Obj]:
    """The observed steps of the cluster's other operations (``uid``'s own excluded): what its ETA learns from."""
    out: list[Obj] = []
    for op in operations:
        if str((op.get("metadata") or {}).get("uid") or "") == uid:
            continue
        progress = (op.get("status") or {}).get("progress")
        observed = progress.get("observed") if isinstance(progress, dict) else None
        out += [o for o in observed or [] if isinstance(o, dict)]
    return out


def remaining_seconds(steps: Sequence[Step], elapsed: float | None, observed: Sequence[Obj] = (),
                      history: Sequence[Obj] = ()) -> float:
    """The time the steps left take. A step takes, first found: its kind's mean in this run (``observed``), its
    node's own time for that kind in the cluster's past operations (``history``), the kind's mean there, else the
    model's cost scaled by this run's pace on the steps done (``elapsed``: seconds since the start; None: the model
    alone)."""
    run, _ = _means(observed)
    past, past_node = _means(history)
    spent = sum(cost(s) for s in steps if s.done)
    pace = max(0.0, elapsed) / spent if elapsed is not None and spent > 0 else 1.0
    left = 0.0
    for s in steps:
        if s.done:
            continue
        kind = step_kind(s)
        found = run.get(kind, past_node.get((s.node, kind), past.get(kind)))
        left += found if found is not None else cost(s) * pace
    return left


def _observe(steps: Sequence[Step], before: Obj, since: dt.datetime | None, now: dt.datetime) -> list[Obj]:
    """status.progress.observed with the steps done since the last write that counted one (``before``: the
    progress as read)."""
    observed = [o for o in before.get("observed") or [] if isinstance(o, dict)]
    done = [s for s in steps if s.done]
    new = len(done) - int(before.get("done") or 0)
    if new <= 0 or since is None:
        return observed[-OBSERVED_MAX:]
    recorded = {(o.get("node"), o.get("step")) for o in observed}
    fresh = [s for s in done if not s.node or (s.node, step_kind(s)) not in recorded][-new:]
    seconds = max(0.0, (now - since).total_seconds()) / max(1, len(fresh))
    # A stage has no node: the key is left out (the schema's node is a string, never null).
    observed += [{**({"node": s.node} if s.node else {}), "step": step_kind(s), "seconds": round(seconds, 3)}
                 for s in fresh]
    return observed[-OBSERVED_MAX:]


def _time(value: object) -> dt.datetime | None:
    """An RFC 3339 time as written here (lastDoneAt with microseconds, startedAt without); None if unreadable."""
    if not value:
        return None
    try:
        t = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def _precise(t: dt.datetime) -> str:
    """With microseconds: each step is timed from it, and a whole second lost per step would add up."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def note_progress(kind: KindDescription, status: Obj, now: dt.datetime, history: Sequence[Obj] = ()) -> None:
    """Set status.progress ({done, total, steps: "done/total", eta, lastDoneAt, observed}) from ``status`` as about
    to be written (its progress as read). ``history``: the cluster's past observed steps (``history_of``).

    The progress as read is kept as it is until a step is counted (or the run starts, or ends): a write that
    changes nothing else stays a write not sent (kube/status.update_status), so progress never adds one. The ETA is
    removed (None: the merge patch drops it) once nothing is left or before the start."""
    steps = kind.steps(status)
    if not steps:
        return
    read = status.get("progress")
    before: Obj = read if isinstance(read, dict) else {}
    done = sum(1 for s in steps if s.done)
    started = _time(status.get("startedAt"))
    finished = done == len(steps) or kind.stage_in(status) == DONE_STAGE
    wants_eta = not finished and started is not None
    if before and (before.get("done"), before.get("total")) == (done, len(steps)) and \
            bool(before.get("eta")) == wants_eta:
        return  # nothing counted since the last write: the estimate stands
    last = _time(before.get("lastDoneAt")) or started
    observed = _observe(steps, before, last, now)
    moved = done > int(before.get("done") or 0)
    elapsed = None if started is None else (now - started).total_seconds()
    progress: Obj = {"done": done, "total": len(steps), "steps": f"{done}/{len(steps)}"}
    if wants_eta:
        progress["eta"] = now_rfc3339(now + dt.timedelta(
            seconds=remaining_seconds(steps, elapsed, observed, history)))
    lately = _precise(now) if moved and started else before.get("lastDoneAt")
    for key, value in (("lastDoneAt", lately), ("observed", observed or None)):
        if value is not None:
            progress[key] = value
    for key in before:
        progress.setdefault(key, None)  # a key no longer said is removed (a merge patch drops only a null)
    status["progress"] = progress
