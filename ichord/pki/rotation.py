"""``rotation.yaml``: the new CAs of a CA rotation, saved before any node is told anything.

Optional keys ``talos``, ``kubernetes``, ``etcd``, ``aggregator``, each ``{crt, key}`` in the
bundle's encoding (base64 of PEM). The keys present are the rotation's targets (docs/decisions.md#ca-rotation-targets):
a restarted daemon reads the targets from here, never from the operation's spec.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki import targets as ca_targets
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.targets import TargetDescription, default_target_names, describe


class _Targets(type):
    """``for t in Target``: every registered target, in the rotation order (as iterating the enum did)."""

    def __iter__(cls) -> Iterator[Target]:
        return iter(target_order())


class Target(metaclass=_Targets):
    """A CA-rotation target; ``value`` is the API name (spec.caRotation.targets). What a target is lives in its
    description (ichord/pki/targets), and the set is open: a description registered there is a target here.

    ``Target(name)`` is the one instance for ``name`` (so ``is`` and ``==`` agree, and it keys dicts as the enum it
    replaces did), or ValueError for a name no registered target has. ``Target.TALOS`` and its three siblings name
    the targets ichord ships, for the code that treats one of them specially."""

    __slots__ = ("value",)
    value: str
    _instances: ClassVar[dict[str, Target]] = {}
    TALOS: ClassVar[Target]
    KUBERNETES: ClassVar[Target]
    ETCD: ClassVar[Target]
    KUBERNETES_AGGREGATOR: ClassVar[Target]

    def __new__(cls, value: str) -> Target:
        try:
            describe(value)
        except KeyError:
            raise ValueError(f"{value!r} is not a CA-rotation target") from None
        found = cls._instances.get(value)
        if found is None:
            found = super().__new__(cls)
            found.value = value
            cls._instances[value] = found
        return found

    def __repr__(self) -> str:
        return f"Target({self.value!r})"

    def __reduce__(self) -> tuple[type[Target], tuple[str]]:
        return Target, (self.value,)

    @property
    def description(self) -> TargetDescription:
        return describe(self.value)

    @property
    def ca_kind(self) -> CAKind | str:
        return self.description.ca_kind

    @property
    def rotation_key(self) -> str:
        """The key in rotation.yaml."""
        return self.description.rotation_key


Target.TALOS = Target("talos")
Target.KUBERNETES = Target("kubernetes")
Target.ETCD = Target("etcd")
Target.KUBERNETES_AGGREGATOR = Target("kubernetes-aggregator")


def target_order() -> tuple[Target, ...]:
    """Every registered target in the rotation order (ichord/pki/targets): rotation.yaml's keys, and the order
    targets are listed in. Read at each call, so a target registered after import is in it."""
    return tuple(Target(t.name) for t in ca_targets.REGISTRY)


def default_targets() -> tuple[Target, ...]:
    """Absent spec.caRotation.targets means these (docs/decisions.md#ca-rotation-targets)."""
    return tuple(Target(name) for name in default_target_names())


#: ichord's own targets in the rotation order, as at import (kept for the readers that name them; a registered
#: target is in ``target_order()``).
TARGET_ORDER = target_order()
#: The default targets as at import (``default_targets()`` includes a registered default target).
DEFAULT_TARGETS = default_targets()


class RotationError(IchordError):
    pass


def parse_targets(names: list[str] | tuple[str, ...] | None) -> tuple[Target, ...]:
    """spec.caRotation.targets -> targets in canonical order; absent or empty = talos, kubernetes."""
    if not names:
        return default_targets()
    seen: set[Target] = set()
    for n in names:
        try:
            t = Target(n)
        except ValueError:
            allowed = ", ".join(t.value for t in target_order())
            raise RotationError(f"unknown CA-rotation target {n!r}; allowed: {allowed}") from None
        if t in seen:
            raise RotationError(f"CA-rotation target {n!r} is listed twice")
        seen.add(t)
    return tuple(t for t in target_order() if t in seen)


@dataclass(frozen=True)
class Rotation:
    """The new CA per target."""

    new: dict[Target, CertificateAuthority]

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(t for t in target_order() if t in self.new)

    def fingerprints(self) -> dict[Target, str]:
        return {t: ca_fingerprint(self.new[t]) for t in self.targets}

    def apply_to(self, bundle: SecretsBundle) -> SecretsBundle:
        """The bundle with the new CAs (what Finalizing writes); keys not in rotation.yaml untouched."""
        return bundle.with_cas({t.ca_kind: ca for t, ca in self.new.items()})

    def to_yaml(self) -> str:
        doc = CommentedMap()
        for t in self.targets:
            ca = self.new[t]
            entry = CommentedMap()
            entry["crt"] = _pem.b64_pem_encode(ca.cert_pem)
            if ca.key_pem is None:
                raise RotationError(f"the new {t.value} CA has no key")
            entry["key"] = _pem.b64_pem_encode(ca.key_pem)
            doc[t.rotation_key] = entry
        return yamlio.dump(doc)

    @classmethod
    def from_yaml(cls, text: str | bytes) -> Rotation:
        try:
            doc: Any = yamlio.load(text)
        except YAMLError:
            raise RotationError("rotation.yaml is not valid YAML") from None
        if not isinstance(doc, dict) or not doc:
            raise RotationError(
                "rotation.yaml holds no CA; it must have at least one of "
                + ", ".join(t.rotation_key for t in target_order())
            )
        by_key = {t.rotation_key: t for t in target_order()}
        new: dict[Target, CertificateAuthority] = {}
        problems = []
        for key, entry in doc.items():
            target = by_key.get(str(key))
            if target is None:
                problems.append(f"unknown key {key!r}")
                continue
            if not isinstance(entry, dict) or not entry.get("crt") or not entry.get("key"):
                problems.append(f"{key} needs crt and key")
                continue
            try:
                ca = CertificateAuthority(
                    _pem.b64_pem_decode(str(entry["crt"]), f"{key}.crt"),
                    _pem.b64_pem_decode(str(entry["key"]), f"{key}.key"),
                )
                if not _pem.key_matches_certificate(ca.private_key, ca.certificate):
                    problems.append(f"{key}.key does not belong to {key}.crt")
                    continue
            except _pem.PEMError as exc:
                problems.append(str(exc))
                continue
            new[target] = ca
        if problems:
            raise RotationError("rotation.yaml is invalid: " + "; ".join(problems))
        return cls(new)


def generate_rotation(targets: tuple[Target, ...]) -> Rotation:
    """New CAs for the targets, with Talos's algorithms and subjects."""
    return Rotation({t: generate_ca(t.description.ca_profile) for t in targets})
