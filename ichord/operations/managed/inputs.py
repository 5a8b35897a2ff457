"""What one step of any operation kind reads fresh: its TalosCluster, the approved TalosMachines and the bundle
Secret (with rotation.yaml when a rotation has written one).

Nothing here is kept between steps: every step reads the operation, the cluster, the machines and
the bundle Secret uncached (docs/decisions.md#rotation-state: a controller killed anywhere resumes from what it reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ichord.api import names
from ichord.api.max_unavailable import MaxUnavailableError, WorkerBound, resolve
from ichord.api.views import ClusterView, MachineSpecError, MachineView, OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.errors import KubeError
from ichord.kube.reads import SecretData
from ichord.operations.bundle_source import BundleSourceError, read_cluster_bundle
from ichord.operations.managed.context import Obj, OperationObject, StepContext
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs


class InputsError(IchordError):
    """An input of the step is missing or invalid; the message says what to fix (scrubbed by the caller)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Inputs(OperationObject):
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
    def cluster_name(self) -> str:
        return str(self.cluster["metadata"]["name"])

    @property
    def cluster_key(self) -> str:
        """``namespace/name`` of the cluster (the key of its managed-cluster client)."""
        return f"{self.op_namespace}/{self.cluster_name}"

    @property
    def control_planes(self) -> list[MachineView]:
        return [m for m in self.machines if m.is_control_plane]


async def load_inputs(ctx: StepContext, op: Obj) -> Inputs:
    """Read the cluster, its approved machines and the bundle Secret uncached; parse the bundle and rotation.yaml.

    Uncached on purpose (docs/decisions.md#rotation-state): a step decides irreversible calls on what it reads here.
    """
    view = OperationView.of(op)
    ns, cluster_name = view.namespace, view.cluster or ""
    try:
        cluster = await crds.clusters(ctx.kube).get(ns, cluster_name)
    except KubeError as exc:  # NotFound and transport errors alike block the step
        raise InputsError(names.StepInputsReason.CLUSTER_UNAVAILABLE,
                          f"cannot read TalosCluster {ns}/{cluster_name}: {SCRUBBER.exception(exc)}") from None
    cluster_view = ClusterView.of(cluster)
    try:
        cluster_inputs = ClusterInputs.from_spec(cluster_view.cluster_name, cluster_view.spec)
    except RenderError as exc:
        raise InputsError(names.StepInputsReason.INVALID_SPEC,
                          f"the TalosCluster spec is invalid: {SCRUBBER.exception(exc)}") from None
    objs, _ = await crds.machines(ctx.kube).list_objects(ns)
    machines = []
    for obj in objs:
        try:
            machine = MachineView.of(obj)
        except MachineSpecError:
            continue
        # A machine whose node or hostname another machine holds is no member (docs/decisions.md#one-owner).
        if machine.cluster == cluster_name and machine.approved and ctx.address_holder(machine) is None:
            machines.append(machine)
    machines.sort(key=lambda m: (not m.is_control_plane, m.name))
    try:
        worker_bound = resolve(view.spec.get("maxUnavailable"), cluster_view.spec.get("maxUnavailable"),
                               ctx.timing.max_unavailable, sum(1 for m in machines if not m.is_control_plane))
    except MaxUnavailableError as exc:
        # Only past the CRD's own validation (an older CRD, a write that bypassed it): nothing is applied until fixed.
        raise InputsError(names.StepInputsReason.INVALID_SPEC, str(exc)) from None
    try:
        read = await read_cluster_bundle(ctx.kube, cluster_view, ctx.allowed_secret_namespaces)
        bundle, rotation = read.full(), read.rotation()
    except BundleSourceError as exc:
        raise InputsError(exc.reason, exc.message) from None
    return Inputs(op, cluster, cluster_inputs, machines, read.secret, bundle, rotation, worker_bound)
