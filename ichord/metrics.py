"""Every Prometheus metric ichord exports, defined once, in one registry."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.registry import Collector


class GaugeSeries(Collector):
    """A labelled gauge held as one dict, label values -> value, for the series there is one of per cluster.

    prometheus_client's ``Gauge.labels(...)`` makes a child per series (an object, a value, a lock): about 730 B.
    Here a series is a dict entry, about 150 B, and the same values can be exported under several names (a
    deprecated alias costs nothing more). ``set`` and ``remove`` are called from the event loop; a scrape reads a
    snapshot of the dict, so a series set during a scrape is in it or in the next one."""

    def __init__(self, names: Sequence[str], documentation: Sequence[str], labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self._families = list(zip(names, documentation, strict=True))
        self._labelnames = list(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def set(self, labels: tuple[str, ...], value: float) -> None:
        self._values[labels] = value

    def remove(self, labels: tuple[str, ...]) -> None:
        """Drop one series; a series that was never set is no error."""
        self._values.pop(labels, None)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, doc in self._families:
            yield GaugeMetricFamily(name, doc, labels=self._labelnames)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = list(self._values.items())
        for name, doc in self._families:
            family = GaugeMetricFamily(name, doc, labels=self._labelnames)
            for labels, value in values:
                family.add_metric(list(labels), value)
            yield family


REGISTRY = CollectorRegistry(auto_describe=True)
# The process (CPU, RSS, fds), Python platform and GC series, as the default registry would carry them.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

#: Labels (namespace, name, certificate). The second name is the one before ichord's metrics took one prefix, the
#: same series under it: deprecated, removed in the next release (README "Metrics").
CERTIFICATE_EXPIRY = GaugeSeries(
    ("ichord_certificate_expiry_timestamp_seconds", "ichor_certificate_expiry_timestamp_seconds"),
    ("notAfter of each cluster CA, as a Unix timestamp.",
     "Deprecated: use ichord_certificate_expiry_timestamp_seconds (the same value); removed in the next release."),
    ["namespace", "name", "certificate"],
    registry=REGISTRY,
)
# ichord_operation_info and ichord_cluster_condition are read from the informers at each scrape
# (watchers/state_metrics.py): a series lives exactly as long as its object, on every replica.
OPERATION_STAGE_DURATION = Histogram(
    "ichord_operation_stage_duration_seconds",
    "How long each stage of an operation took.",
    ["kind", "stage"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200),
    registry=REGISTRY,
)
TALOS_RPC_DURATION = Histogram(
    "ichord_talos_rpc_duration_seconds",
    "Talos API calls by method and gRPC status code.",
    ["method", "code"],
    registry=REGISTRY,
)
KUBE_REQUEST_DURATION = Histogram(
    "ichord_kube_request_duration_seconds",
    "Kubernetes API requests by verb and HTTP status code.",
    ["verb", "code"],
    registry=REGISTRY,
)
#: Labels (cluster,).
ACTOR_MAILBOX_DEPTH = GaugeSeries(
    ("ichord_actor_mailbox_depth",), ("Pending messages per cluster actor.",), ["cluster"], registry=REGISTRY
)
ACTOR_STEP_DURATION = Histogram(
    "ichord_actor_step_duration_seconds", "Duration of one cluster actor step.", registry=REGISTRY
)
RECONCILE_OUTCOMES = Counter(
    "ichord_reconcile_outcomes_total",
    "Outcomes of the cluster actors' phases, by phase, outcome type (Done/Requeue/Blocked/Failed) and reason.",
    ["phase", "outcome", "reason"],
    registry=REGISTRY,
)
ACTOR_STEPS = Counter(
    "ichord_actor_steps_total",
    "Cluster actor steps by what woke them: a timer (the step's own requested wake-up) or the kind of object "
    "whose change was told (TalosCluster, TalosMachine, TalosOperation, Secret); one step counts once per kind.",
    ["cause"],
    registry=REGISTRY,
)
ACTOR_RESTARTS = Counter("ichord_actor_restarts_total", "Crashed cluster actors restarted.", registry=REGISTRY)
LEADER = Gauge("ichord_leader", "1 while this replica leads.", registry=REGISTRY)
LEADERLESS_SECONDS = Gauge(
    "ichord_leaderless_seconds",
    "Seconds since this replica last saw a replica hold the leader Lease (renewing it, or this one's own renewal).",
    registry=REGISTRY,
)
NO_LEADER = Gauge(
    "ichord_no_leader",
    "1 when this replica has seen no replica lead for longer than the leader Lease lasts (no takeover happened).",
    registry=REGISTRY,
)
TRUST_EXTRA_CAS = Gauge("ichord_trust_extra_cas", "Extra Kubernetes CAs in the trust pool.", registry=REGISTRY)
WATCH_RESTARTS = Counter(
    "ichord_watch_restarts_total",
    "Watch streams restarted, by resource and reason.",
    ["resource", "reason"],
    registry=REGISTRY,
)
