"""What a CA target is, as data: one ``TargetDescription`` per module of this package."""

from __future__ import annotations

from dataclasses import dataclass

from ichord.contract import VersionContract
from ichord.pki.ca import CAKind


@dataclass(frozen=True)
class TargetDescription:
    """One CA-rotation target (docs/decisions.md#ca-rotation-targets)."""

    #: The API name: spec.caRotation.targets, renewBeforeByTarget's key, status.certificates[].name.
    name: str
    #: The CA of the secrets bundle it rotates; ``ca_kind.value`` is the bundle's key.
    ca_kind: CAKind
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
