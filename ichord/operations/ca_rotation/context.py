"""What one step of a ca-rotation works with: the shared handles, and the inputs read fresh every step.

Nothing here is kept between steps: every step reads the operation, the cluster, the machines and
the bundle Secret uncached (docs/decisions.md#rotation-state: a controller killed anywhere resumes from what it reads).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.api import names
from ichord.api.max_unavailable import MaxUnavailableError, WorkerBound, resolve
from ichord.api.views import ClusterView, MachineSpecError, MachineView, OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError
from ichord.kube.events import EventRecorder
from ichord.kube.reads import SecretData
from ichord.operations.bundle_source import BundleSourceError, read_cluster_bundle
from ichord.operations.managed.clients import ManagedClients
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

Obj = dict[str, Any]
Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _no_trust_hook(_new_ca_pem: bytes, _current_ca_pem: bytes) -> None:
    """The trust pool (a later issue) replaces this; the seam is called on every pass that reads rotation.yaml."""


def _talos_client(dial: DialBundle) -> TalosClient:
    return TalosClient(dial, dial_timeout=10.0, rpc_timeout=60.0)


@dataclass
class RotationContext:
    kube: KubeClient  # the management API: operations, clusters, machines, the bundle Secret, the lock
    namespace: str  # the controller namespace (the bundle Secret and the lock live in the cluster's namespace)
    recorder: EventRecorder
    timing: Timing
    now: Clock = _utcnow
    #: Called with the new and the current Kubernetes CA certificates (public parts only) on every pass that
    #: reads rotation.yaml.
    trust_hook: Callable[[bytes, bytes], None] = _no_trust_hook
    talos_factory: Callable[[DialBundle], TalosClient] = field(default=_talos_client)
    #: Asked with the current Kubernetes CA before a rotation of it starts: why ichord cannot safely rotate it
    #: (its own client would be locked out at Issuing), or None. The trust pool fills it.
    trust_refusal: Callable[[bytes], str | None] = lambda _current_ca_pem: None
    #: Whether a Kubernetes CA is the one of the API server ichord talks to (TrustHooks.own_cluster).
    own_cluster: Callable[[bytes], bool] = lambda _ca_pem: False
    #: Told of every write of the operation (the step's scope keeps its copy current for the phases after it).
    observe: Callable[[Obj], None] = lambda _obj: None
    #: The cluster's operations as the step's scope listed them (None: list them, e.g. a test driving one step).
    operations: list[OperationView] | None = None
    #: Namespaces other than the cluster's own that its secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    #: The managed-cluster clients the operation keeps across steps (ca_rotation_operation's), by cluster key;
    #: None: every read asks a control plane for a fresh admin kubeconfig.
    managed: ManagedClients | None = None


class InputsError(IchordError):
    """An input of the step is missing or invalid; the message says what to fix (scrubbed by the caller)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Inputs:
    op: Obj
    cluster: Obj
    cluster_inputs: ClusterInputs
    machines: list[MachineView]  # approved, control planes first, then workers, by name
    secret: SecretData = field(repr=False)
    bundle: SecretsBundle = field(repr=False)
    rotation: Rotation | None = field(repr=False)
    #: The workers a pass (or a config rollout) changes at once: spec.maxUnavailable of the operation, else of the
    #: cluster, else the daemon's --max-unavailable, over the approved workers (api/max_unavailable.py).
    worker_bound: WorkerBound

    @property
    def uid(self) -> str:
        return str(self.op["metadata"]["uid"])

    @property
    def name(self) -> str:
        return str(self.op["metadata"]["name"])

    @property
    def op_namespace(self) -> str:
        return str(self.op["metadata"]["namespace"])

    @property
    def cluster_name(self) -> str:
        return str(self.cluster["metadata"]["name"])

    @property
    def cluster_key(self) -> str:
        """``namespace/name`` of the cluster (the key of its managed-cluster client)."""
        return f"{self.op_namespace}/{self.cluster_name}"

    @property
    def status(self) -> Obj:
        return dict(self.op.get("status") or {})

    @property
    def control_planes(self) -> list[MachineView]:
        return [m for m in self.machines if m.is_control_plane]


async def load_inputs(ctx: RotationContext, op: Obj) -> Inputs:
    """Read the cluster, its approved machines and the bundle Secret uncached; parse the bundle and rotation.yaml.

    Uncached on purpose (docs/decisions.md#rotation-state): a rotation step decides irreversible calls on what it reads
    here.
    """
    view = OperationView.of(op)
    ns, cluster_name = view.namespace, view.cluster or ""
    try:
        cluster = await crds.clusters(ctx.kube).get(ns, cluster_name)
    except KubeError as exc:  # NotFound and transport errors alike block the step
        raise InputsError(names.CARotationReason.CLUSTER_UNAVAILABLE,
                          f"cannot read TalosCluster {ns}/{cluster_name}: {SCRUBBER.exception(exc)}") from None
    cluster_view = ClusterView.of(cluster)
    try:
        cluster_inputs = ClusterInputs.from_spec(cluster_view.cluster_name, cluster_view.spec)
    except RenderError as exc:
        raise InputsError(names.CARotationReason.INVALID_SPEC,
                          f"the TalosCluster spec is invalid: {SCRUBBER.exception(exc)}") from None
    objs, _ = await crds.machines(ctx.kube).list_objects(ns)
    machines = []
    for obj in objs:
        try:
            machine = MachineView.of(obj)
        except MachineSpecError:
            continue
        if machine.cluster == cluster_name and machine.approved:
            machines.append(machine)
    machines.sort(key=lambda m: (not m.is_control_plane, m.name))
    try:
        worker_bound = resolve(view.spec.get("maxUnavailable"), cluster_view.spec.get("maxUnavailable"),
                               ctx.timing.max_unavailable, sum(1 for m in machines if not m.is_control_plane))
    except MaxUnavailableError as exc:
        # Only past the CRD's own validation (an older CRD, a write that bypassed it): nothing is applied until fixed.
        raise InputsError(names.CARotationReason.INVALID_SPEC, str(exc)) from None
    try:
        read = await read_cluster_bundle(ctx.kube, cluster_view, ctx.allowed_secret_namespaces)
        bundle, rotation = read.full(), read.rotation()
    except BundleSourceError as exc:
        raise InputsError(exc.reason, exc.message) from None
    return Inputs(op, cluster, cluster_inputs, machines, read.secret, bundle, rotation, worker_bound)
