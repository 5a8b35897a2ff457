"""Which CAs a node trusts, read from its running configuration, and whether a bundle is one of them
(docs/decisions.md#bundle-belongs).

    talos                   machine.ca (signs) + machine.acceptedCAs                    every role, every contract
    kubernetes              KubeAPIServerCAConfig issuingCA + acceptedCAs (v1.14)        every role
                            cluster.ca + cluster.acceptedCAs (v1.13)
    etcd                    cluster.etcd.ca.crt: one PEM bundle, the first signs          control planes (both)
                            (the rest trusted during an etcd rotation)
    kubernetes-aggregator   KubeAggregatorCAConfig issuingCA + acceptedCAs (v1.14)        control planes
                            cluster.aggregatorCA (v1.13)

A worker's configuration carries no etcd nor aggregator CA (Talos gives them to control planes only), so a worker
is judged on the first two alone. Only certificates are read, and kept as SHA-256 fingerprints (what
``status.certificates`` shows): never a key. A bundle belongs to the nodes when, for each of these CAs, its CA (or,
during a rotation, rotation.yaml's new one) is among those the node trusts; a node whose configuration names no CA
of a kind is not judged on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint, certificate_fingerprint

#: The CAs compared, by their rotation targets' names, and how a message names each.
TITLES = {"talos": "Talos API CA", "kubernetes": "Kubernetes CA", "etcd": "etcd CA",
          "kubernetes-aggregator": "Kubernetes aggregator (front-proxy) CA"}
#: Each CA's key in ``status.trustedCAs`` and its field here (rotation.yaml's key: ``aggregator``).
FIELDS = {"talos": "talos", "kubernetes": "kubernetes", "etcd": "etcd", "kubernetes-aggregator": "aggregator"}


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


def _typed_cas(doc: Mapping[str, Any]) -> list[bytes]:
    """A v1.14 CA document's certificates: ``issuingCA.cert`` then ``acceptedCAs`` (PEM text)."""
    issuing = doc.get("issuingCA")
    return [p for p in (_pem_text(issuing.get("cert") if isinstance(issuing, Mapping) else None),
                        *map(_pem_text, _listed(doc.get("acceptedCAs")))) if p]


@dataclass(frozen=True)
class NodeTrust:
    """The fingerprints of the CAs one node's configuration trusts, per CA (the first one signs)."""

    talos: tuple[str, ...] = ()
    kubernetes: tuple[str, ...] = ()
    etcd: tuple[str, ...] = ()
    aggregator: tuple[str, ...] = ()

    def of(self, name: str) -> tuple[str, ...]:
        fps: tuple[str, ...] = getattr(self, FIELDS[name])
        return fps

    @classmethod
    def of_config(cls, documents: Sequence[Any]) -> NodeTrust:
        """From the plain documents of a machine configuration (``MachineConfig.plain_of``)."""
        found: dict[str, list[bytes]] = {f: [] for f in FIELDS.values()}
        for doc in documents:
            if not isinstance(doc, Mapping):
                continue
            if doc.get("kind") == "KubeAPIServerCAConfig":
                found["kubernetes"] += _typed_cas(doc)
            elif doc.get("kind") == "KubeAggregatorCAConfig":
                found["aggregator"] += _typed_cas(doc)
            elif doc.get("version") == "v1alpha1" and "kind" not in doc:
                machine = _section(doc, "machine")
                found["talos"] += [p for p in (_b64_crt(machine.get("ca")),
                                               *map(_b64_crt, _listed(machine.get("acceptedCAs")))) if p]
                cluster = _section(doc, "cluster")
                found["kubernetes"] += [p for p in (_b64_crt(cluster.get("ca")),
                                                    *map(_b64_crt, _listed(cluster.get("acceptedCAs")))) if p]
                found["aggregator"] += [p for p in (_b64_crt(cluster.get("aggregatorCA")),) if p]
                found["etcd"] += [p for p in (_b64_crt(_section(cluster, "etcd").get("ca")),) if p]
        return cls(**{f: _fingerprints(pems) for f, pems in found.items()})

    def as_status(self) -> dict[str, list[str]]:
        """``TalosMachine.status.trustedCAs``."""
        return {field: list(self.of(name)) for name, field in FIELDS.items()}

    @classmethod
    def from_status(cls, value: object) -> NodeTrust | None:
        """What ``as_status`` wrote (None: never read, or not in that shape). A CA a record of an older ichord does
        not carry is one the node is not judged on until it is read again."""
        if not isinstance(value, Mapping):
            return None
        lists = {field: value.get(field, []) for field in FIELDS.values()}
        if not all(isinstance(v, list) and all(isinstance(fp, str) for fp in v) for v in lists.values()):
            return None
        return cls(**{field: tuple(v) for field, v in lists.items()})


@dataclass(frozen=True)
class BundleCAs:
    """The CAs of a bundle Secret, per CA: secrets.yaml's first, then rotation.yaml's new one during a rotation."""

    talos: tuple[str, ...]
    kubernetes: tuple[str, ...]
    etcd: tuple[str, ...] = ()  # () : not compared
    aggregator: tuple[str, ...] = ()

    def of(self, name: str) -> tuple[str, ...]:
        fps: tuple[str, ...] = getattr(self, FIELDS[name])
        return fps

    @classmethod
    def of_bundle(cls, bundle: SecretsBundle, rotation: Mapping[str, bytes] | None = None) -> BundleCAs:
        """``rotation``: the new CAs' certificates rotation.yaml holds, by target name."""
        extra = rotation or {}
        own = {"talos": bundle.os, "kubernetes": bundle.k8s, "etcd": bundle.etcd,
               "kubernetes-aggregator": bundle.k8s_aggregator}
        return cls(**{FIELDS[name]: (ca_fingerprint(ca), *_fingerprints([extra[name]] if name in extra else []))
                      for name, ca in own.items()})

    @classmethod
    def of_render(cls, node: NodeTrust) -> BundleCAs:
        """The CAs a rendered configuration (read with ``NodeTrust.of_config``) would hand its node: a render is
        the bundle's, and during a rotation's pass also its new CAs'."""
        return cls(**{field: node.of(name) for name, field in FIELDS.items()})


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
                 if node.of(name) and bundle.of(name) and not set(bundle.of(name)) & set(node.of(name)))


def describe_refusals(refused: Sequence[Refusal], where: str) -> str:
    """``the bundle's Talos API CA <fp> is not among the CAs <where> trusts (<fp>, ...)``, for each refused CA."""
    return "; ".join(f"the bundle's {r.title} {r.bundle} is not among the CAs {where} trusts ({', '.join(r.node)})"
                     for r in refused)


class BundleMismatchError(IchordError):
    """An apply would hand a node CAs none of which it trusts (docs/decisions.md#bundle-belongs): the bundle Secret
    is not the node's, and nothing is applied to it. Not a TalosError: no handler of a refused apply swallows it; an
    operation is Blocked on it (BundleMismatch) until the cluster's own bundle is back.

    ``endpoint``: the node's address as dialled."""

    def __init__(self, endpoint: str, refused: tuple[Refusal, ...]) -> None:
        self.endpoint = endpoint
        self.refused = refused
        where = f"the node at {endpoint}"
        super().__init__(f"{describe_refusals(refused, where)}: the bundle Secret holds CAs this node does not trust "
                         "(another cluster's?); nothing was applied to it")


def check_render_belongs(endpoint: str, running: Sequence[Any], rendered: Sequence[Any]) -> None:
    """Raise BundleMismatchError when the ``rendered`` plain documents would hand the node running ``running`` a CA
    of a kind none of which it trusts. A rotation's pass trusts old and new together, so it never trips this."""
    refused = refusals(BundleCAs.of_render(NodeTrust.of_config(rendered)), NodeTrust.of_config(running))
    if refused:
        raise BundleMismatchError(endpoint, refused)
