"""The Talos (OS) CA: the Talos API's machine certificates and the operator's talosconfig."""

from __future__ import annotations

from ichord.pki.ca import CAKind
from ichord.pki.targets.description import TargetDescription

TARGET = TargetDescription(
    name="talos", ca_kind=CAKind.OS, rotation_key="talos", expiry_rank=0, default=True,
    control_plane_only=False, restarts_apiserver=False, reboot_roll=False, hands_off=True,
    issuing_is_point_of_no_return=False,
)
