"""The etcd CA: peers and kube-apiserver's etcd client; loaded only at boot, so its passes reboot control planes."""

from __future__ import annotations

from ichord.pki.ca import CAKind
from ichord.pki.targets.description import TargetDescription

TARGET = TargetDescription(
    name="etcd", ca_kind=CAKind.ETCD, rotation_key="etcd", expiry_rank=30, default=False,
    # kube-apiserver's etcd client CA changes too, and Talos restarts the static pod for it.
    control_plane_only=True, restarts_apiserver=True, reboot_roll=True, hands_off=False,
    # A member back on the old CA would not trust its neighbours.
    issuing_is_point_of_no_return=True,
)
