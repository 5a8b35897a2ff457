"""Every Prometheus metric ichord exports, defined once, in one registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector

REGISTRY = CollectorRegistry(auto_describe=True)
# The process (CPU, RSS, fds), Python platform and GC series, as the default registry would carry them.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

CERTIFICATE_EXPIRY = Gauge(
    "ichord_certificate_expiry_timestamp_seconds",
    "notAfter of each cluster CA, as a Unix timestamp.",
    ["namespace", "name", "certificate"],
    registry=REGISTRY,
)
#: The name before ichord's metrics took one prefix, the same series under it: deprecated, removed in the next
#: release (README "Metrics"). Always set and removed together with CERTIFICATE_EXPIRY.
CERTIFICATE_EXPIRY_DEPRECATED = Gauge(
    "ichor_certificate_expiry_timestamp_seconds",
    "Deprecated: use ichord_certificate_expiry_timestamp_seconds (the same value); removed in the next release.",
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
ACTOR_MAILBOX_DEPTH = Gauge(
    "ichord_actor_mailbox_depth", "Pending messages per cluster actor.", ["cluster"], registry=REGISTRY
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
