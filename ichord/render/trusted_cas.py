"""Which CAs a node trusts, read from its running configuration, and whether a bundle is one of them
(docs/decisions.md#bundle-belongs).

    talos        machine.ca (signs) + machine.acceptedCAs                             every contract
    kubernetes   KubeAPIServerCAConfig issuingCA + acceptedCAs (v1.14)
                 cluster.ca + cluster.acceptedCAs (v1.13)

Only certificates are read, and kept as SHA-256 fingerprints (what ``status.certificates`` shows): never a key.
A bundle belongs to the nodes when, for each of these CAs, its CA (or, during a rotation, rotation.yaml's new one)
is among those the node trusts; a node whose configuration names no CA of a kind is not judged on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint, certificate_fingerprint

#: The CAs compared, by their rotation targets' names, and how a message names each.
TITLES = {"talos": "Talos API CA", "kubernetes": "Kubernetes CA"}


def _fingerprints(pems: Iterable[bytes]) -> tuple[str, ...]:
    out: list[str] = []
    for pem in pems:
        for block in _pem.pem_blocks(pem):
            if _pem.pem_label(block) != "CERTIFICATE":
                continue
            try:
                fp = certificate_fingerprint(block)
            except _pem.PEMError:
                continue  # a certificate the node could not use either: it trusts nothing by it
            if fp not in out:
                out.append(fp)
    return tuple(out)


def _b64_crt(entry: object) -> bytes | None:
    crt = entry.get("crt") if isinstance(entry, Mapping) else entry if isinstance(entry, str) else None
    if not isinstance(crt, str) or not crt:
        return None
    try:
        return _pem.b64_pem_decode(crt, "a CA certificate")
    except _pem.PEMError:
        return None


def _pem_text(value: object) -> bytes | None:
    return value.encode() if isinstance(value, str) and value.strip() else None


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


@dataclass(frozen=True)
class NodeTrust:
    """The fingerprints of the CAs one node's configuration trusts, per CA (the first one signs)."""

    talos: tuple[str, ...] = ()
    kubernetes: tuple[str, ...] = ()

    def of(self, name: str) -> tuple[str, ...]:
        return self.talos if name == "talos" else self.kubernetes

    @classmethod
    def of_config(cls, documents: Sequence[Any]) -> NodeTrust:
        """From the plain documents of a machine configuration (``MachineConfig.plain_of``)."""
        talos: list[bytes] = []
        kubernetes: list[bytes] = []
        for doc in documents:
            if not isinstance(doc, Mapping):
                continue
            if doc.get("kind") == "KubeAPIServerCAConfig":
                issuing = doc.get("issuingCA")
                kubernetes += [p for p in (_pem_text(issuing.get("cert") if isinstance(issuing, Mapping) else None),
                                           *map(_pem_text, _listed(doc.get("acceptedCAs")))) if p]
            elif doc.get("version") == "v1alpha1" and "kind" not in doc:
                machine = _section(doc, "machine")
                talos += [p for p in (_b64_crt(machine.get("ca")),
                                      *map(_b64_crt, _listed(machine.get("acceptedCAs")))) if p]
                cluster = _section(doc, "cluster")
                kubernetes += [p for p in (_b64_crt(cluster.get("ca")),
                                           *map(_b64_crt, _listed(cluster.get("acceptedCAs")))) if p]
        return cls(_fingerprints(talos), _fingerprints(kubernetes))

    def as_status(self) -> dict[str, list[str]]:
        """``TalosMachine.status.trustedCAs``."""
        return {name: list(self.of(name)) for name in TITLES}

    @classmethod
    def from_status(cls, value: object) -> NodeTrust | None:
        """What ``as_status`` wrote (None: never read, or not in that shape)."""
        if not isinstance(value, Mapping):
            return None
        lists = {name: value.get(name) for name in TITLES}
        if not all(isinstance(v, list) and all(isinstance(fp, str) for fp in v) for v in lists.values()):
            return None
        return cls(**{name: tuple(v) for name, v in lists.items()})  # type: ignore[arg-type]


@dataclass(frozen=True)
class BundleCAs:
    """The CAs of a bundle Secret, per CA: secrets.yaml's first, then rotation.yaml's new one during a rotation."""

    talos: tuple[str, ...]
    kubernetes: tuple[str, ...]

    def of(self, name: str) -> tuple[str, ...]:
        return self.talos if name == "talos" else self.kubernetes

    @classmethod
    def of_bundle(cls, bundle: SecretsBundle, rotation: Mapping[str, bytes] | None = None) -> BundleCAs:
        """``rotation``: the new CAs' certificates rotation.yaml holds, by target name."""
        extra = rotation or {}
        return cls(
            (ca_fingerprint(bundle.os), *_fingerprints([extra["talos"]] if "talos" in extra else [])),
            (ca_fingerprint(bundle.k8s), *_fingerprints([extra["kubernetes"]] if "kubernetes" in extra else [])),
        )


@dataclass(frozen=True)
class Refusal:
    """One CA of the bundle that a node does not trust: the bundle's fingerprint and the node's."""

    name: str
    bundle: str
    node: tuple[str, ...]

    @property
    def title(self) -> str:
        return TITLES[self.name]


def refusals(bundle: BundleCAs, node: NodeTrust) -> tuple[Refusal, ...]:
    """The bundle's CAs none of which the node trusts (empty: the bundle belongs to the node)."""
    return tuple(Refusal(name, bundle.of(name)[0], node.of(name)) for name in TITLES
                 if node.of(name) and not set(bundle.of(name)) & set(node.of(name)))
