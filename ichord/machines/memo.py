"""What a machine's last step learned, kept by content so a converged machine is checked without re-deriving it.

A converged machine is read again every drift resync (and on every step of its cluster). Rendering its
configuration and parsing what the node runs were the largest costs of such a step, and both are functions of
content: the render of its inputs (the bundle, the cluster's inputs, the machine's own), the plain form of the
node's bytes. The memo keeps only their hashes, one of each per machine (no documents: a fleet of 4,000 machines
would hold gigabytes), and each is used only when its content is equal to what it was computed from: the
inputs compared by value, the node's bytes by SHA-256. A changed spec, bundle or node configuration is a miss.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ichord.pki.bundle import SecretsBundle
from ichord.render.inputs import ClusterInputs, MachineInputs

RenderKey = tuple[SecretsBundle, ClusterInputs, MachineInputs]


@dataclass
class MachineMemo:
    _render_key: RenderKey | None = field(default=None, repr=False)  # holds the bundle: never in a repr
    _rendered_hash: str = ""
    _running_digest: bytes = b""
    _running_hash: str = ""

    def rendered_hash(self, key: RenderKey) -> str | None:
        """The hash of what ``key`` renders to, when it was rendered last; None otherwise."""
        if self._render_key is not None and self._render_key == key:
            return self._rendered_hash
        return None

    def remember_render(self, key: RenderKey, config_hash: str) -> None:
        self._render_key, self._rendered_hash = key, config_hash

    def running_hash(self, running: bytes) -> str | None:
        """The hash of the plain form of the node's configuration ``running``, when these bytes were read last."""
        if self._running_digest and self._running_digest == _digest(running):
            return self._running_hash
        return None

    def remember_running(self, running: bytes, config_hash: str) -> None:
        self._running_digest, self._running_hash = _digest(running), config_hash

    def forget(self) -> None:
        self._render_key, self._rendered_hash, self._running_digest, self._running_hash = None, "", b"", ""


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
