"""status.progress of every operation kind: steps done of the total, how long each part took, and an ETA.

The steps are the kind's (``KindDescription.steps``: a config rollout's planned machines, a ca-rotation's planned
stages and its etcd roll's reboots); what each costs comes from the model the rehearsal uses (``DEFAULTS``,
docs/architecture.md#rehearsal).

- ``observed``: per node and kind of step, how long it took in this run, with when it began: a step's parts
  (``Step.parts``: drain, apply, reboot to Ready, kube-apiserver restart to ready, the checks before a node
  without a drain starts, a stage) are cut at the times the operation's markers write (a worker's slot taken,
  its apply begun, its reboot asked for; a restart's apply), the first from the step's start (its slot, else the
  step counted done before it), the last to the write that counts it done. A step with no mark of its own is one
  entry, its kinds joined (``drain+apply+reboot``, as an older ichord recorded every step). At most
  ``OBSERVED_MAX`` entries, the latest kept: ``ichord cluster rehearse`` reads them from past operations.
- ``running``: the marks of the steps under way, kept from write to write (a worker's slot, with its marks, is
  gone in the write that records it done), dropped once the step is observed.
- ``eta``: the time the steps left take, run as the operation runs them: one after the other, and the parallel
  ones (a rollout's workers) on the kind's ``slots`` at once, each slot taking the next; a step under way counts
  what is left of it. A part takes, first found: its kind's mean in this run, its node's in the cluster's past
  operations, the kind's there, else the model's cost scaled by this run's pace (what the kinds seen so far took
  over what the model says they cost; before any, the time since the start over the model's cost of the steps
  done; before the first step is done, the model alone). A step whose parts are not all known takes an older
  ichord's whole-step record of its kind when there is one.

Written by the backbone's one status writer, inside the write a step makes anyway (operations/backbone.py): never a
write of its own. Times are the step's clock, as every other time the step writes.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.api.conditions import now_rfc3339
from ichord.api.operation_kinds import DONE_STAGE, START_MARK, KindDescription, Step

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


def _middle(kind: str) -> float:
    """The model's seconds for one kind of step (0 for a kind it has no cost for: the checks)."""
    return (DEFAULTS[kind][0] + DEFAULTS[kind][1]) / 2 if kind in DEFAULTS else 0.0


def cost(step: Step) -> float:
    """The model's seconds for ``step``: the middle of each of its kinds' range."""
    return sum(_middle(k) for k in step.costs)


def step_kind(step: Step) -> str:
    """How a step with no mark of its own is named: its kinds of the model joined (``drain+apply+reboot``)."""
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


def _medians(entries: Iterable[Obj], key: Callable[[Obj], object]) -> dict[Any, float]:
    grouped: dict[Any, list[float]] = {}
    for o in entries:
        if isinstance(o.get("seconds"), int | float):
            grouped.setdefault(key(o), []).append(float(o["seconds"]))
    return {k: statistics.median(v) for k, v in grouped.items()}


@dataclass(frozen=True)
class Model:
    """What a step left is expected to take: this run's observed parts, the cluster's past, the model's cost.

    This run's own part of a kind is the node's own when this run saw it already (a ca-rotation's passes visit
    each control plane again), else the median of those seen (one slow node is that node's, not every node's) of
    the steps run as this one is (beside others or alone: on a busy host a step shares its time with those beside
    it), else of all."""

    run: dict[tuple[str, bool], float]
    run_any: dict[str, float]
    run_node: dict[tuple[str, str], float]
    past: dict[str, float]
    past_node: dict[tuple[str, str], float]
    pace: float

    @classmethod
    def of(cls, steps: Sequence[Step], elapsed: float | None, observed: Sequence[Obj],
           history: Sequence[Obj]) -> Model:
        beside = {s.node for s in steps if s.parallel and s.node}
        entries = [o for o in observed if isinstance(o, dict)]
        run = _medians(entries, lambda o: (str(o.get("step") or ""), o.get("node") in beside))
        run_any = _medians(entries, lambda o: str(o.get("step") or ""))
        run_node = _medians([o for o in entries if o.get("node")], lambda o: (str(o["node"]), str(o.get("step"))))
        past, past_node = _means(history)
        seen = [(str(o["step"]), float(o["seconds"])) for o in entries
                if isinstance(o.get("seconds"), int | float) and str(o.get("step")) in DEFAULTS]
        modelled = sum(_middle(k) for k, _ in seen)
        spent = sum(cost(s) for s in steps if s.done)
        if modelled > 0:
            pace = sum(t for _, t in seen) / modelled
        elif elapsed is not None and spent > 0:
            pace = max(0.0, elapsed) / spent
        else:
            pace = 1.0
        return cls(run, run_any, run_node, past, past_node, pace)

    def part(self, kind: str, step: Step) -> float | None:
        found = self.run_node.get((step.node, kind), self.run.get((kind, step.parallel), self.run_any.get(kind)))
        return found if found is not None else self.past_node.get((step.node, kind), self.past.get(kind))

    def seconds(self, step: Step) -> float:
        """The seconds ``step`` takes from its start."""
        known = [self.part(k, step) for k in step.kinds]
        if all(t is not None for t in known):
            return sum(t for t in known if t is not None)
        whole = step_kind(step)  # an older ichord's record of the whole step, where the parts are not all known
        found = self.run_any.get(whole, self.past_node.get((step.node, whole), self.past.get(whole)))
        if found is not None:
            return found
        # A part the model has no cost for in this step (a control plane's drain, the checks) costs nothing there.
        return sum(t if t is not None else _middle(k) * self.pace * (k in step.costs)
                   for k, t in zip(step.kinds, known, strict=True))


def predicted_seconds(kind: KindDescription, status: Obj, node: str, history: Sequence[Obj] = ()) -> float | None:
    """The seconds the next step of ``node`` takes from its start, as the ETA prices it from this run's timed parts
    and the cluster's past operations (``history``); None when neither has timed any kind it is made of (the
    caller's default decides then, not the model's cost for a real cluster)."""
    steps = kind.steps(status)
    step = next((s for s in steps if s.node == node and not s.done), None)
    if step is None:
        return None
    read = status.get("progress")
    observed = read.get("observed") if isinstance(read, dict) else None
    model = Model.of(steps, None, [o for o in observed or [] if isinstance(o, dict)], history)
    whole = step_kind(step)
    if all(model.part(k, step) is None for k in step.kinds) and whole not in model.run_any and \
            whole not in model.past:
        return None
    return model.seconds(step)


def remaining_seconds(steps: Sequence[Step], elapsed: float | None, observed: Sequence[Obj] = (),
                      history: Sequence[Obj] = (), *, slots: int = 1,
                      under_way: dict[str, float] | None = None) -> float:
    """The time the steps left take, in the order the operation runs them: a step after the one before it, a run
    of parallel steps on ``slots`` at once (each slot takes the next step as it frees). ``under_way``: the seconds
    each step already under way has run (by ``Step.name``), which it no longer has to take. ``elapsed``: seconds
    since the start (the pace before any kind is seen; None: the model alone)."""
    model = Model.of(steps, elapsed, observed, history)
    running = under_way or {}

    def left(s: Step) -> float:
        return max(0.0, model.seconds(s) - running.get(s.name, 0.0))

    clock = 0.0
    lanes: list[float] = []
    for s in steps:
        if s.done:
            continue
        if not s.parallel:
            clock = max([clock, *lanes]) + left(s)
            lanes = []
            continue
        if not lanes:
            lanes = [clock] * max(1, slots)
        lanes.sort()
        lanes[0] += left(s)
    return max([clock, *lanes])


def _order_under_way(steps: Sequence[Step], running: dict[str, dict[str, str]]) -> list[Step]:
    """The steps left with those under way first among their parallel neighbours (they hold the slots now)."""
    out: list[Step] = []
    group: list[Step] = []
    for s in steps:
        if s.parallel:
            group.append(s)
            continue
        out += [*sorted(group, key=lambda g: g.name not in running), s]
        group = []
    return out + sorted(group, key=lambda g: g.name not in running)


def _running(steps: Sequence[Step], before: Obj) -> dict[str, dict[str, str]]:
    """The marks of every step under way: what the status says of it now, over what earlier writes kept."""
    kept = before.get("running")
    kept = kept if isinstance(kept, dict) else {}
    out: dict[str, dict[str, str]] = {}
    for s in steps:
        if s.done or not s.name:
            continue
        marks = {**{str(k): str(v) for k, v in (kept.get(s.name) or {}).items() if v}, **dict(s.marks)}
        if marks:
            out[s.name] = marks
    return out


def _entries(s: Step, marks: dict[str, str], start: dt.datetime, end: dt.datetime) -> list[Obj]:
    """The step's parts, cut at its marks (a mark written to the second, before the step's precise start, is
    taken at the start; the marks read are the step's own: ``Step.marks``)."""
    cuts = [(k, min(max(t, start), end)) for k in s.kinds[1:] if (t := _time(marks.get(k))) is not None]
    node: Obj = {"node": s.node} if s.node else {}  # a stage names no node (the schema's node is never null)
    if not cuts:
        return [{**node, "step": s.kinds[0] if len(s.kinds) == 1 else step_kind(s),
                 "seconds": round((end - start).total_seconds(), 3), "startedAt": _precise(start)}]
    bounds = [(s.kinds[0], start), *cuts, ("", end)]
    return [{**node, "step": k, "seconds": round(max(0.0, (bounds[i + 1][1] - t).total_seconds()), 3),
             "startedAt": _precise(t)} for i, (k, t) in enumerate(bounds[:-1])]


def _observe(steps: Sequence[Step], before: Obj, running: dict[str, dict[str, str]], since: dt.datetime | None,
             now: dt.datetime) -> list[Obj]:
    """status.progress.observed with the steps done since the last write that counted one (``before``: the
    progress as read; ``running``: the marks of the steps under way as the last write kept them)."""
    observed = [o for o in before.get("observed") or [] if isinstance(o, dict)]
    new = sum(1 for s in steps if s.done) - int(before.get("done") or 0)
    if new <= 0 or since is None:
        return observed[-OBSERVED_MAX:]
    done = [s for s in steps if s.done]
    # Those under way at the last write first (certainly new), then the latest done in the plan's order.
    fresh = [s for s in done if s.name in running]
    fresh += [s for s in done if s.name not in running][::-1][:max(0, new - len(fresh))][::-1]
    plain = [s for s in fresh if not _time({**running.get(s.name, {}), **dict(s.marks)}.get(START_MARK))]
    share = max(0.0, (now - since).total_seconds()) / max(1, len(plain))  # counted done together: the time shared
    at = since
    for s in fresh:
        marks = {**running.get(s.name, {}), **dict(s.marks)}
        start = _time(marks.get(START_MARK))
        if start is None:
            start, at = at, at + dt.timedelta(seconds=share)
            end = at if len(plain) > 1 else now
        else:
            end = now
        observed += _entries(s, marks, min(start, end), end)
    return observed[-OBSERVED_MAX:]


def _replacing(kept: Obj, running: dict[str, dict[str, str]]) -> Obj | None:
    """``running`` as a merge patch of ``kept`` (a merge patch merges maps: a step no longer under way is spelled
    null); None when both are empty."""
    if not running:
        return None
    return {**{k: None for k in kept if k not in running}, **running}


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


def note_progress(kind: KindDescription, status: Obj, now: dt.datetime, history: Sequence[Obj] = (), *,
                  carried: bool = True) -> None:
    """Set status.progress ({done, total, steps: "done/total", eta, lastDoneAt, observed, running}) from ``status``
    as about to be written (its progress as read). ``history``: the cluster's past observed steps
    (``history_of``). ``carried``: the write changes something else too (it is sent anyway).

    The progress as read is kept as it is until a step is counted (or the run starts, or ends), or, in a write
    sent anyway, a step under way shows a new mark: a write that changes nothing else stays a write not sent
    (kube/status.update_status), so progress never adds one. The ETA is removed (None: the merge patch drops it)
    once nothing is left or before the start."""
    steps = kind.steps(status)
    if not steps:
        return
    read = status.get("progress")
    before: Obj = read if isinstance(read, dict) else {}
    done = sum(1 for s in steps if s.done)
    started = _time(status.get("startedAt"))
    finished = done == len(steps) or kind.stage_in(status) == DONE_STAGE
    wants_eta = not finished and started is not None
    kept = before.get("running") if isinstance(before.get("running"), dict) else {}
    running = _running(steps, before)
    if before and (before.get("done"), before.get("total")) == (done, len(steps)) and \
            bool(before.get("eta")) == wants_eta and (running == (kept or {}) or not carried):
        return  # nothing counted since the last write (nor marked in a write sent anyway): the estimate stands
    last = _time(before.get("lastDoneAt")) or started
    observed = _observe(steps, before, {str(k): dict(v) for k, v in (kept or {}).items() if isinstance(v, dict)},
                        last, now)
    moved = done > int(before.get("done") or 0)
    lately = now if moved and started else _time(before.get("lastDoneAt")) or started
    elapsed = None if started is None else (now - started).total_seconds()
    progress: Obj = {"done": done, "total": len(steps), "steps": f"{done}/{len(steps)}"}
    if wants_eta:
        under_way = {name: (now - t).total_seconds() for name, marks in running.items()
                     if (t := _time(marks.get(START_MARK))) is not None}
        current = next((s for s in steps if not s.done), None)
        if current is not None and not current.parallel and lately is not None:
            under_way.setdefault(current.name, (now - lately).total_seconds())  # it began when the last one ended
        left = remaining_seconds(_order_under_way(steps, running), elapsed, observed, history,
                                 slots=kind.slots(status), under_way=under_way)
        progress["eta"] = now_rfc3339(now + dt.timedelta(seconds=left + 0.5))  # to the nearest second
    for key, value in (("lastDoneAt", _precise(now) if moved and started else before.get("lastDoneAt")),
                       ("observed", observed or None), ("running", _replacing(kept or {}, running))):
        if value is not None:
            progress[key] = value
    for key in before:
        progress.setdefault(key, None)  # a key no longer said is removed (a merge patch drops only a null)
    status["progress"] = progress
