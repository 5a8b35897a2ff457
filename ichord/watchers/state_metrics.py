"""The per-object series, read from the informers at each scrape: a series lives exactly as long as its object.

    ichord_operation_info{namespace, cluster, operation, kind, phase, stage}   1 per TalosOperation
    ichord_cluster_condition{namespace, name, condition, status, reason}       1 per TalosCluster condition

Every replica runs the informers, so every replica (leader or follower) answers the same from the same live
state, and a deleted object's series is gone at the next scrape on all of them: nothing is set, so nothing is
left behind to remove (before, gauges set by the leader outlived deleted operations and fired the chart's
IchordOperationFailed/Paused until a restart). The chart's rules aggregate with ``max by`` over replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ichord.api.names import Phase
from ichord.api.views import OperationView, cluster_ref
from ichord.watchers.informer import Informer

OPERATION_INFO = "ichord_operation_info"
CLUSTER_CONDITION = "ichord_cluster_condition"


class StateCollector(Collector):
    def __init__(self, clusters: Informer, operations: Informer) -> None:
        self._clusters = clusters
        self._operations = operations

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self.families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info, conditions = self.families()
        for (namespace, name), obj in sorted(self._operations.cache.items()):
            op = OperationView.of(obj)
            info.add_metric([namespace, cluster_ref(obj) or "", name, op.kind, op.phase or Phase.PENDING, op.stage],
                            1.0)
        for (namespace, name), obj in sorted(self._clusters.cache.items()):
            for cond in _conditions(obj):
                conditions.add_metric([namespace, name, str(cond.get("type")), str(cond.get("status")),
                                       str(cond.get("reason") or "")], 1.0)
        yield info
        yield conditions

    @staticmethod
    def families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(OPERATION_INFO, "One series per TalosOperation with its phase and stage.",
                              labels=["namespace", "cluster", "operation", "kind", "phase", "stage"]),
            GaugeMetricFamily(CLUSTER_CONDITION,
                              "1 per TalosCluster condition with its current status and reason (the chart's alerts "
                              "on BundleBackupStale and CAClientsNotRestarted read it).",
                              labels=["namespace", "name", "condition", "status", "reason"]),
        )


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return [c for c in conditions if isinstance(c, dict) and c.get("type")]
