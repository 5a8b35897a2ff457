"""The CA targets of a ca-rotation, one description each (docs/architecture.md#how-to-add-a-ca-target).

Each module of this package describes one target; ``REGISTRY`` lists them once, in the rotation order: the order of
``spec.caRotation.targets``' enum, of rotation.yaml, of ``status.plan.targets`` and ``status.caRotation.targets``,
and of the due targets a renewal operation's name is hashed from. ``status.certificates`` keeps the order its
CRD documents (talos, kubernetes, kubernetes-aggregator, etcd): each description's ``expiry_rank`` places it.

Pure data, importable from every layer (pki stands alone): the readers (``pki/rotation``, ``render/stages``,
``api/abandonable``, ``operations/cert_expiry``, ``operations/renewal``, ``ca_rotation/plan``, ``ca_view``,
``apiserver_instances``) ask a description instead of naming a target.
"""

from __future__ import annotations

from ichord.pki.targets import aggregator, etcd, kubernetes, talos
from ichord.pki.targets.description import TargetDescription

#: Every target, in the rotation order (see the module's docstring); ``register`` adds one.
REGISTRY: list[TargetDescription] = [talos.TARGET, kubernetes.TARGET, etcd.TARGET, aggregator.TARGET]


def register(description: TargetDescription) -> TargetDescription:
    """Add a target, last in the rotation order (a new name goes at the end of the CRD's enum too): registering a
    target is this one call (docs/architecture.md#how-to-add-a-ca-target). A name or a rotation.yaml key
    registered twice is a mistake, never an override."""
    clash = [t.name for t in REGISTRY if description.name == t.name or description.rotation_key == t.rotation_key]
    if clash:
        raise ValueError(f"CA-rotation target {description.name!r} clashes with {clash[0]!r} (name or rotation key)")
    REGISTRY.append(description)
    return description


def describe(name: str) -> TargetDescription:
    """The description of target ``name`` (its API name); KeyError when no target has it."""
    for target in REGISTRY:
        if target.name == name:
            return target
    raise KeyError(name)


def target_names() -> tuple[str, ...]:
    """The API names in the rotation order (spec.caRotation.targets' enum, renewBeforeByTarget's keys)."""
    return tuple(t.name for t in REGISTRY)


def default_target_names() -> tuple[str, ...]:
    """What an absent spec.caRotation.targets means (docs/decisions.md#ca-rotation-targets)."""
    return tuple(t.name for t in REGISTRY if t.default)


def in_certificate_order() -> tuple[TargetDescription, ...]:
    """Every target in status.certificates' order (its CRD's enum)."""
    return tuple(sorted(REGISTRY, key=lambda t: t.expiry_rank))


def certificate_names() -> tuple[str, ...]:
    """status.certificates' names in its order."""
    return tuple(t.name for t in in_certificate_order())


__all__ = ["REGISTRY", "TargetDescription", "certificate_names", "default_target_names", "describe",
           "in_certificate_order", "register", "target_names"]
