"""What ichord knows of each TalosOperation kind, as data: one description per kind, registered once.

    kind         condition      stage/step in        holds machines  excludes others  finalizer
    ca-rotation  CARotation     status.caRotation    yes             yes              ichor.maesh.dev/ca-rotation
    config       ConfigRollout  status               no              no               ichor.maesh.dev/config

The views (``OperationView``), the backbone, ``ichord cluster status``, the operation CLI and the cluster actor
read these descriptions and name no kind. A kind's behaviour (its ``advance``, what it covers and disrupts) carries
its description (``ichord/operations/``: ``Operation.spec.description``), and ``Registry.register`` puts that
description here: registering a kind is that one line (docs/architecture.md#how-to-add-an-operation-kind). The
kinds ichord ships are also described here at import, because the CLI reads them and builds no
registry; ``tests/unit/test_crd_registry.py`` checks the CRD's enum, rules and columns against this table and that
each shipped kind's behaviour carries the description listed here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ichord.api import names
from ichord.api.abandonable import ca_rotation_abandonable
from ichord.pki.rotation import Target

if TYPE_CHECKING:
    from ichord.api.views import OperationView

#: Where every kind's stage and step are readable, whatever section it keeps its own in: the printer columns'
#: source (the CRD's Stage and Step columns); a kind with a section mirrors them here (operations/backbone.py).
STAGE_COLUMN = ".status.stage"
STEP_COLUMN = ".status.step"
#: The printer columns every kind's progress is read from (operations/progress.py writes them in every status write).
PROGRESS_COLUMN = ".status.progress.steps"
ETA_COLUMN = ".status.progress.eta"
#: The last stage of every kind: an operation there has nothing left under way.
DONE_STAGE = "Done"


def _never(_op: OperationView) -> bool:
    """A kind that says nothing is never abandoned on a delete: it is held (DeletionHeld) and runs on."""
    return False


def _always(_op: OperationView) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    """One counted step of an operation (status.progress): what it costs (step kinds of the duration model,
    operations/progress.py) and whether the status records it done.

    ``parts``: the kinds of step its time is recorded in, in order (``drain, apply, reboot`` for a machine a
    rollout reboots; ``checks`` is the time before a node that is not drained starts: the checks and gates before
    its apply or its reboot); the first
    begins with the step, each other at its mark. ``marks``: what the status says of the step's own times now
    (``start`` when it was taken, and the RFC 3339 time each later part began, as the operation's markers write
    them). ``parallel``: it runs beside the parallel steps next to it, up to the kind's ``slots``. ``key``: names
    the step among those under way (its node, unless a node has several steps)."""

    costs: tuple[str, ...]
    done: bool
    node: str = ""
    parts: tuple[str, ...] = ()
    marks: tuple[tuple[str, str], ...] = ()
    parallel: bool = False
    key: str = ""

    @property
    def name(self) -> str:
        return self.key or self.node

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.parts or self.costs


#: Where a step's own marks name when it was taken (the other marks are its parts).
START_MARK = "start"
#: The stages of a ca-rotation that are passes: each reboots the control planes when etcd is a target.
PASS_STAGES = ("Accepting", "Issuing", "Dropping")


def _no_steps(_status: Mapping[str, object]) -> list[Step]:
    return []


def _one_slot(_status: Mapping[str, object]) -> int:
    return 1


def _plan(status: Mapping[str, object]) -> Mapping[str, object]:
    plan = status.get("plan")
    return plan if isinstance(plan, dict) else {}


def _names(value: object) -> list[str]:
    return [str(x) for x in value] if isinstance(value, list) else []


def _entries(value: object) -> list[Mapping[str, object]]:
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _marks(**times: object) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(v)) for k, v in times.items() if v)


def _own(section: Mapping[str, object], name: str, current: str, done: str) -> bool:
    """The section's marker times are ``name``'s: it is the machine under way there, or the last one it did (the
    times stay after a machine is done, until the next one's replace them)."""
    finished = _names(section.get(done))
    return section.get(current) == name or (bool(finished) and finished[-1] == name)


def _roll_marks(status: Mapping[str, object], name: str, costs: tuple[str, ...], parallel: bool,
                ) -> tuple[tuple[str, str], ...]:
    if parallel:  # a worker's own marker, in its slot (operations/config/workers.py) while it is under way
        slots = status.get("workerRolls")
        slot = slots.get(name) if isinstance(slots, dict) else None
        if not isinstance(slot, dict):
            return ()
        return _marks(start=slot.get("startedAt"), apply=slot.get("stagedAt"), reboot=slot.get("requestedAt"))
    if "reboot" in costs:
        roll = _section(status, "roll")
        if _own(roll, name, "rebooting", "done"):
            return _marks(apply=roll.get("stagedAt"), reboot=roll.get("requestedAt"))
        return ()
    restart = _section(status, "apiServerRestart")
    return _marks(apiserver_restart=restart.get("appliedAt")) if _own(restart, name, "machine", "done") else ()


def _restarting_targets() -> set[str]:
    """The targets whose passes restart kube-apiserver on each control plane, one at a time."""
    return {t.value for t in Target if t.description.restarts_apiserver}


def stage_steps(status: Mapping[str, object], section: str | None) -> list[Step]:
    """One step per planned stage (status.plan.stages), done once the stage under way is a later one. Before each
    pass stage's own: one per control plane whose kube-apiserver the pass restarts (a target that restarts it),
    done once the pass saw it restarted and ready (status.machines[].apiServer, per stage), timed from its apply
    (caRotation.apiServerInstances); then one per control plane the etcd roll reboots (plan.machines with
    reboots), done once the roll records it (caRotation.etcdRestarted, per stage). Earlier stages' are done."""
    plan = _plan(status)
    listed = plan.get("stages")
    stages = [str(s) for s in listed if s] if isinstance(listed, list) else []
    own = _section(status, section)
    current = str(own.get("stage") or "")
    at = len(stages) if current == DONE_STAGE else stages.index(current) if current in stages else 0
    planned = plan.get("machines")
    machines = [m for m in planned if isinstance(m, dict) and m.get("name")] if isinstance(planned, list) else []
    rebooting = [str(m["name"]) for m in machines if m.get("reboots")]
    restarting = [str(m["name"]) for m in machines if m.get("role") == "controlplane"] \
        if set(_names(plan.get("targets"))) & _restarting_targets() else []
    now = {str(e.get("name")): e for e in _entries(status.get("machines"))}
    instances = {str(e.get("machine")): e for e in _entries(own.get("apiServerInstances"))}
    rolled = set(_names(own.get("etcdRestarted")))
    steps: list[Step] = []
    for i, stage in enumerate(stages):
        here, passing = i == at, stage in PASS_STAGES
        for cp in restarting if passing else []:
            marks = _marks(apiserver_restart=instances[cp].get("appliedAt")) if here and cp in instances else ()
            restarted = here and (now.get(cp) or {}).get("apiServer") == "Restarted"
            steps.append(Step(("apply", "apiserver_restart"), i < at or restarted, cp, ("checks", "apiserver_restart"),
                              marks, key=f"{stage}/{cp}/kube-apiserver"))
        for cp in rebooting if passing else []:
            marks = _marks(reboot=own.get("etcdRestartedAt")) if here and _own(
                own, cp, "etcdRebooting", "etcdRestarted") else ()
            steps.append(Step(("reboot",), i < at or (here and cp in rolled), cp, ("checks", "reboot"), marks,
                              key=f"{stage}/{cp}/reboot"))
        steps.append(Step(("stage",), i < at))
    return steps


def machine_steps(status: Mapping[str, object]) -> list[Step]:
    """One step per planned machine (status.plan.machines), done once its roll or restart records it done: a
    reboot costs an apply and a reboot (a worker's a drain too), a kube-apiserver restart an apply and a restart.
    The workers but the plan's last machine run beside each other (``parallel``: operations/config/workers.py)."""
    done = set(_names(_section(status, "roll").get("done"))) | set(_names(_section(status, "apiServerRestart").get(
        "done")))
    finished = str(status.get("stage") or "") == DONE_STAGE
    steps = []
    planned = _plan(status).get("machines")
    listed = [m for m in planned if isinstance(m, dict) and m.get("name")] if isinstance(planned, list) else []
    for i, m in enumerate(listed):
        name = str(m["name"])
        parts: tuple[str, ...]
        if m.get("reboots"):
            costs: tuple[str, ...] = ("apply", "reboot") if m.get("role") == "controlplane" else (
                "drain", "apply", "reboot")
            # Every machine that reboots is cordoned and drained first (operations/config/reboot.py), a control
            # plane too: its time to the apply is its drain (with the gates before it), as a worker's is.
            parts = ("drain", "apply", "reboot")
        else:
            costs, parts = ("apply", "apiserver_restart"), ("checks", "apiserver_restart")
        parallel = bool(m.get("reboots")) and m.get("role") != "controlplane" and i < len(listed) - 1
        steps.append(Step(costs, finished or name in done, name, parts, _roll_marks(status, name, costs, parallel),
                          parallel))
    return steps


def worker_slots(status: Mapping[str, object]) -> int:
    """The workers a config rollout takes at once, as its plan resolved them (plan.workerBound.atOnce)."""
    bound = _plan(status).get("workerBound")
    at_once = bound.get("atOnce") if isinstance(bound, dict) else None
    return max(1, at_once) if isinstance(at_once, int) else 1


@dataclass(frozen=True)
class KindDescription:
    """The facts about one operation kind (``spec.kind``) that code outside the kind's own package asks."""

    #: spec.kind (the CRD's enum).
    name: str
    #: The condition the kind reports its progress in (the operation's own Succeeded follows the phase).
    condition_type: str
    #: The finalizer a started operation carries until it lets go of the cluster.
    finalizer: str
    #: How messages name one operation of the kind ("a CA rotation, TalosOperation ns/x ... is unfinished").
    title: str
    #: status.<section> holds the kind's stage, step and progress (mirrored to status.stage/step for the printer
    #: columns); None: status.stage and status.step themselves.
    section: str | None = None
    #: Under way, the machine reconciler stands aside on the cluster's nodes (Ready Unknown, nothing applied): the
    #: operation's stage is the only record of what the nodes must run.
    holds_machines: bool = False
    #: Under way, no other disruptive operation of the cluster may take the cluster lock.
    excludes_others: bool = False
    #: Its section lists the CAs being rotated (``certificates``) and status.machines each node's state in the
    #: rotation: ``ichord cluster status`` shows both.
    rotates_cas: bool = False
    #: The stage (or the kind's condition reason) in which the operator runs ``ichord cluster credentials``.
    awaits_credentials: str | None = None
    #: docs/decisions.md#abandon-or-hold: may an operation in this state be abandoned when it is deleted?
    abandonable: Callable[[OperationView], bool] = _never
    #: The steps status.progress counts, read from a status of the kind (its plan and what it records done).
    steps: Callable[[Mapping[str, object]], list[Step]] = _no_steps
    #: How many of its parallel steps run at once, read from a status of the kind.
    slots: Callable[[Mapping[str, object]], int] = _one_slot

    def stage_in(self, status: Mapping[str, object]) -> str:
        """The stage under way as ``status`` records it ('' before the start)."""
        return str(_section(status, self.section).get("stage") or "")

    def step_in(self, status: Mapping[str, object]) -> str:
        return str(_section(status, self.section).get("step") or "")


def _section(status: Mapping[str, object], section: str | None) -> Mapping[str, object]:
    if section is None:
        return status
    found = status.get(section)
    return found if isinstance(found, dict) else {}


CA_ROTATION = KindDescription(
    name=names.KIND_CA_ROTATION, condition_type=names.CA_ROTATION, finalizer=names.CA_ROTATION_FINALIZER,
    title="a CA rotation", section="caRotation", holds_machines=True, excludes_others=True, rotates_cas=True,
    awaits_credentials=names.CARotationReason.AWAITING_CREDENTIALS, abandonable=ca_rotation_abandonable,
    steps=lambda status: stage_steps(status, "caRotation"))
#: A config rollout may always be abandoned: deleting it gives back its cordons and lets the lock go.
CONFIG = KindDescription(
    name=names.KIND_CONFIG, condition_type=names.CONFIG_ROLLOUT, finalizer=f"{names.GROUP}/config",
    title="a config operation", abandonable=_always, steps=machine_steps, slots=worker_slots)

#: spec.kind -> its description: every kind this version of ichord knows.
KINDS: dict[str, KindDescription] = {}


def register(description: KindDescription) -> KindDescription:
    """Add a kind's description (once: a name registered twice is a mistake, never an override)."""
    if description.name in KINDS:
        raise ValueError(f"operation kind {description.name!r} is described twice")
    KINDS[description.name] = description
    return description


def describe(kind: str) -> KindDescription | None:
    """The description of ``kind``, or None for a kind this version of ichord does not know."""
    return KINDS.get(kind)


def sections() -> list[str]:
    """The status sections kinds keep their stage in (a status names its kind's section only)."""
    return [d.section for d in KINDS.values() if d.section]


# The kinds ichord ships are described at import: the CLI reads them and builds no registry.
register(CA_ROTATION)
register(CONFIG)
