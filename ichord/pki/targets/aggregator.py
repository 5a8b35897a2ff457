"""The front-proxy (aggregator) CA: kube-apiserver's requests to extension API servers."""

from __future__ import annotations

from ichord.contract import V1_14
from ichord.pki.ca import CAKind
from ichord.pki.targets.description import TargetDescription

TARGET = TargetDescription(
    name="kubernetes-aggregator", ca_kind=CAKind.AGGREGATOR, rotation_key="aggregator", expiry_rank=20, default=False,
    control_plane_only=True, restarts_apiserver=True, reboot_roll=False, hands_off=False,
    issuing_is_point_of_no_return=False,
    minimum_contract=V1_14,
    minimum_contract_why="(KubeAggregatorCAConfig); the cluster uses {contract}, which has a single aggregator CA "
                         "and no accepted list",
)
