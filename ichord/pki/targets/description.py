"""What a CA target is, as data: one ``TargetDescription`` per module of this package."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ichord.contract import VersionContract
from ichord.pki.ca import CA_PROFILES, CAKind, CAProfile

#: Where a target's CAs land in a rendered machine configuration (ichord/render/stages.py calls it with the
#: configuration, the certificate to add, whether the machine is a control plane and its contract). Typed loosely:
#: pki sits below render (docs/architecture.md), so the configuration is ``Any`` here.
RenderWriter = Callable[[Any, bytes, bool, VersionContract], None]
#: How a node shows the target's CAs (ichord/operations/ca_rotation/ca_view.py calls it with the Talos client,
#: the node's address and the step's memo of resources read): ``{"issuing": fingerprint, "trusted": [...]}``.
NodeReader = Callable[[Any, str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class TargetDescription:
    """One CA-rotation target (docs/decisions.md#ca-rotation-targets)."""

    #: The API name: spec.caRotation.targets, renewBeforeByTarget's key, status.certificates[].name.
    name: str
    #: The CA of the secrets bundle it rotates: one of Talos's four (``ca_kind.value`` is the bundle's key), or the
    #: key under ``certs`` of a CA ichord keeps in the bundle beside them (then ``profile`` says how it is made).
    ca_kind: CAKind | str
    #: Its key in rotation.yaml.
    rotation_key: str
    #: Place in status.certificates (the CRD documents that order; it is not the rotation order); spaced by 10 so a
    #: new target can go between two.
    expiry_rank: int
    #: Rotated when spec.caRotation.targets is absent.
    default: bool
    #: Only control planes carry it (workers hold no copy, have no CA view of it and are not re-rendered for it).
    control_plane_only: bool
    #: Its passes re-render what kube-apiserver loads, so Talos restarts the static pod on every control plane.
    restarts_apiserver: bool
    #: Loaded only at boot: every control plane reboots once per pass (docs/decisions.md#etcd-reboot-roll).
    reboot_roll: bool
    #: The operator's talosconfig or kubeconfig is signed by it: the rotation waits in AwaitingCredentials
    #: (docs/decisions.md#credentials-handoff).
    hands_off: bool
    #: Once Issuing has run, abandoning the rotation would strand a node or a pod on the old CA
    #: (docs/decisions.md#abandon-or-hold); a target that is still accepted alongside the new one says False.
    issuing_is_point_of_no_return: bool
    #: The oldest Talos contract that can rotate it, and what older ones lack (None: every supported contract).
    minimum_contract: VersionContract | None = None
    minimum_contract_why: str = ""
    #: How a new CA of the target is made (None: as Talos makes the bundle's ``ca_kind``).
    profile: CAProfile | None = None
    #: Adds a trusted certificate of the target to a rendered configuration and, for a CA the renderer does not
    #: place itself (``ca_kind`` a str), places the signing one first (None: the renderer's own, render/stages.py).
    render_writer: RenderWriter | None = None
    #: Reads the node's view of the target's CAs (None: ichord's own, operations/ca_rotation/ca_view.py).
    node_reader: NodeReader | None = None

    @property
    def bundle_key(self) -> str:
        """The key under ``certs`` of secrets.yaml."""
        return self.ca_kind.value if isinstance(self.ca_kind, CAKind) else self.ca_kind

    @property
    def ca_profile(self) -> CAProfile:
        if self.profile is not None:
            return self.profile
        if not isinstance(self.ca_kind, CAKind):
            raise ValueError(f"CA-rotation target {self.name!r}: a CA outside Talos's four needs a profile")
        return CA_PROFILES[self.ca_kind]
