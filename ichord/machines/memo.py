"""Hashes of configurations, kept by content so a machine is checked without re-deriving what did not change.

Every step of a cluster checks each machine: render its configuration, read what the node runs, compare. Both
sides are functions of content: the render of its inputs (the bundle, the cluster's inputs, the machine's own),
the plain form of the node's bytes. A cluster's machines share one memo: control planes without per-machine
patches render, and run, the very same configuration, so a cold start renders and parses it once per cluster
and role, and a drift resync of an unchanged machine does neither.

A machine whose difference is only reported (it waits for a reboot, for a ``config`` rollout) is checked every step
of its cluster until the rollout reaches it: its classification (a round-trip parse and a diff, ~0.1 s) is kept
by the node's bytes and the render's hash, so a rollout over a hundred waiting workers does not parse each of
them again on every step.

Only hashes and classifications are kept (no documents: a fleet of 4,000 machines would hold gigabytes), at most
``limit`` of each kind (the cluster's machine count; the least recently used go first), and each is given back only
for content equal to what it was computed from: the inputs compared by value, the node's bytes by SHA-256. A
changed spec, bundle or node configuration is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CertificateAuthority
from ichord.render.fieldmeta import Classification
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.trusted_cas import NodeTrust


class ConfigMemo:
    def __init__(self, limit: int = 8) -> None:
        self.limit = max(1, limit)
        # machine inputs -> (bundle digest, cluster inputs, hash of the render); keyed by the part that is hashable.
        # The bundle itself is not kept: its parsed keys and certificates would stay alive per cluster.
        self._renders: dict[MachineInputs, tuple[bytes, ClusterInputs, str]] = {}
        # SHA-256 of a node's configuration -> (hash of its plain form, the CAs it trusts)
        self._running: dict[bytes, tuple[str, NodeTrust]] = {}
        # (SHA-256 of the node's configuration, hash of the render, contract, role) -> the difference classified.
        self._classified: dict[tuple[bytes, str, str, str], Classification] = {}

    def __repr__(self) -> str:  # the entries hold cluster inputs (patches may hold credentials): never in a repr
        return (f"ConfigMemo(renders={len(self._renders)}, running={len(self._running)}, "
                f"classified={len(self._classified)}, limit={self.limit})")

    def rendered_hash(self, bundle: SecretsBundle, cluster: ClusterInputs, machine: MachineInputs) -> str | None:
        """The hash of what these inputs render to, when they were rendered before; None otherwise."""
        hit = self._renders.get(machine)
        if hit is None or hit[1] != cluster or hit[0] != bundle_digest(bundle):
            return None
        self._renders[machine] = self._renders.pop(machine)  # most recently used last
        return hit[2]

    def remember_render(self, bundle: SecretsBundle, cluster: ClusterInputs, machine: MachineInputs,
                        config_hash: str) -> None:
        self._renders.pop(machine, None)
        self._renders[machine] = (bundle_digest(bundle), cluster, config_hash)
        _trim(self._renders, self.limit)

    def running(self, running: bytes) -> tuple[str, NodeTrust] | None:
        """The hash of the plain form of the node configuration ``running`` and the CAs it trusts, when these bytes
        were read before."""
        digest = _digest(running)
        found = self._running.pop(digest, None)
        if found is not None:
            self._running[digest] = found
        return found

    def remember_running(self, running: bytes, config_hash: str, trust: NodeTrust) -> None:
        digest = _digest(running)
        self._running.pop(digest, None)
        self._running[digest] = (config_hash, trust)
        _trim(self._running, self.limit)

    def classification(self, running: bytes, rendered_hash: str, contract: str, role: str) -> Classification | None:
        """How the difference from the node's ``running`` bytes to the render ``rendered_hash`` classified, when it
        was classified before (for the same contract and role)."""
        key = (_digest(running), rendered_hash, contract, role)
        found = self._classified.pop(key, None)
        if found is not None:
            self._classified[key] = found
        return found

    def remember_classification(self, running: bytes, rendered_hash: str, contract: str, role: str,
                                result: Classification) -> None:
        key = (_digest(running), rendered_hash, contract, role)
        self._classified.pop(key, None)
        self._classified[key] = result
        _trim(self._classified, self.limit)

    def bound(self, limit: int) -> None:
        """Keep at most ``limit`` entries of each kind from now on (the cluster's machine count)."""
        self.limit = max(1, limit)
        _trim(self._renders, self.limit)
        _trim(self._running, self.limit)
        _trim(self._classified, self.limit)

    def __len__(self) -> int:
        return len(self._renders) + len(self._running) + len(self._classified)


def _trim(entries: dict[Any, Any], limit: int) -> None:
    while len(entries) > limit:
        del entries[next(iter(entries))]  # the least recently used


def bundle_digest(bundle: SecretsBundle) -> bytes:
    """SHA-256 over every compared field of the bundle (each length-prefixed): equal digests, equal bundles."""
    h = hashlib.sha256()
    for f in dataclasses.fields(bundle):
        if not f.compare:
            continue
        value = getattr(bundle, f.name)
        if isinstance(value, CertificateAuthority):
            parts: tuple[object, ...] = (value.cert_pem, value.key_pem)
        elif isinstance(value, Mapping):  # extra_cas: each bundle key and its CA, in key order
            parts = tuple(p for k in sorted(value) for p in (k, value[k].cert_pem, value[k].key_pem))
        else:
            parts = (value,)
        for part in parts:
            if part is None:
                h.update(b"\xff" * 8)  # no length prefix is all ones: None differs from every value
                continue
            data = part.encode() if isinstance(part, str) else part
            if not isinstance(data, bytes):
                raise TypeError(f"SecretsBundle.{f.name}: a {type(part).__name__} the memo cannot digest")
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
    return h.digest()


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
