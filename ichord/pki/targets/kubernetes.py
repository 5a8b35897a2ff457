"""The Kubernetes CA: kube-apiserver's clients and serving, kube-root-ca.crt in every namespace, the kubeconfig."""

from __future__ import annotations

from ichord.pki.ca import CAKind
from ichord.pki.targets.description import TargetDescription

TARGET = TargetDescription(
    name="kubernetes", ca_kind=CAKind.KUBERNETES, rotation_key="kubernetes", expiry_rank=10, default=True,
    control_plane_only=True, restarts_apiserver=True, reboot_roll=False, hands_off=True,
    # After Issuing the pods hold only the new CA (kube-root-ca.crt).
    issuing_is_point_of_no_return=True,
)
