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

if TYPE_CHECKING:
    from ichord.api.views import OperationView

#: Where every kind's stage and step are readable, whatever section it keeps its own in: the printer columns'
#: source (the CRD's Stage and Step columns); a kind with a section mirrors them here (operations/backbone.py).
STAGE_COLUMN = ".status.stage"
STEP_COLUMN = ".status.step"
#: The last stage of every kind: an operation there has nothing left under way.
DONE_STAGE = "Done"


def _never(_op: OperationView) -> bool:
    """A kind that says nothing is never abandoned on a delete: it is held (DeletionHeld) and runs on."""
    return False


def _always(_op: OperationView) -> bool:
    return True


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
    awaits_credentials=names.CARotationReason.AWAITING_CREDENTIALS, abandonable=ca_rotation_abandonable)
#: A config rollout may always be abandoned: deleting it gives back its cordons and lets the lock go.
CONFIG = KindDescription(
    name=names.KIND_CONFIG, condition_type=names.CONFIG_ROLLOUT, finalizer=f"{names.GROUP}/config",
    title="a config operation", abandonable=_always)

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
