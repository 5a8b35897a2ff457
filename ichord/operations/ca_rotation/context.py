"""What one step of a ca-rotation works with: the shared handles, and the inputs read fresh every step.

Nothing here is kept between steps: every step reads the operation, the cluster, the machines and
the bundle Secret uncached (ADR 0063: a controller killed anywhere resumes from what it reads).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.kube.reads import SecretData, read_secret
from ichord.machines.view import MachineSpecError, MachineView
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation
from ichord.pki.scrub import SCRUBBER
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
    namespace: str  # the controller namespace: bundle Secrets and Leases
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


class InputsError(Exception):
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
    def status(self) -> Obj:
        return dict(self.op.get("status") or {})

    @property
    def ca_status(self) -> Obj:
        return dict(self.status.get("caRotation") or {})

    @property
    def control_planes(self) -> list[MachineView]:
        return [m for m in self.machines if m.is_control_plane]


async def load_inputs(ctx: RotationContext, op: Obj) -> Inputs:
    """Read the cluster, its approved machines and the bundle Secret uncached; parse the bundle and rotation.yaml."""
    meta = op.get("metadata") or {}
    ns = str(meta.get("namespace") or "")
    cluster_name = str(((op.get("spec") or {}).get("clusterRef") or {}).get("name") or "")
    try:
        cluster = await crds.clusters(ctx.kube).get(ns, cluster_name)
    except Exception as exc:  # NotFound and transport errors alike block the step
        raise InputsError("ClusterUnavailable",
                          f"cannot read TalosCluster {ns}/{cluster_name}: {SCRUBBER.exception(exc)}") from None
    spec = cluster.get("spec") or {}
    try:
        cluster_inputs = ClusterInputs.from_spec(str(spec.get("clusterName") or cluster_name), spec)
    except Exception as exc:
        raise InputsError(names.CARotationReason.INVALID_SPEC,
                          f"the TalosCluster spec is invalid: {SCRUBBER.exception(exc)}") from None
    objs, _ = await crds.machines(ctx.kube).list_objects(ns)
    machines = []
    for obj in objs:
        if ((obj.get("spec") or {}).get("clusterRef") or {}).get("name") != cluster_name:
            continue
        try:
            view = MachineView.of(obj)
        except MachineSpecError:
            continue
        if view.approved:
            machines.append(view)
    machines.sort(key=lambda m: (not m.is_control_plane, m.name))
    secret_name = str((spec.get("secretsRef") or {}).get("name") or "")
    try:
        secret = await read_secret(ctx.kube, ctx.namespace, secret_name)
    except Exception as exc:
        raise InputsError("BundleUnavailable", f"cannot read the bundle Secret {ctx.namespace}/{secret_name}: "
                                               f"{SCRUBBER.exception(exc)}") from None
    raw = secret.data.get(names.SECRETS_KEY)
    if raw is None:
        raise InputsError("BundleUnavailable", f"Secret {ctx.namespace}/{secret_name} has no key {names.SECRETS_KEY}")
    try:
        bundle = _parse_bundle(raw, f"Secret {ctx.namespace}/{secret_name} key {names.SECRETS_KEY}")
    except Exception as exc:
        raise InputsError("BundleInvalid", SCRUBBER.exception(exc)) from None
    rotation = None
    raw_rotation = secret.data.get(names.ROTATION_KEY)
    if raw_rotation is not None:
        try:
            rotation = _parse_rotation(raw_rotation)
        except Exception as exc:
            raise InputsError("RotationInvalid", f"{names.ROTATION_KEY} in Secret {ctx.namespace}/{secret_name}: "
                                                 f"{SCRUBBER.exception(exc)}") from None
    return Inputs(op, cluster, cluster_inputs, machines, secret, bundle, rotation)


def register_rotation(rotation: Rotation) -> None:
    """Every new CA key goes to the scrubber before it can reach any message."""
    SCRUBBER.register_all(ca.key_pem for ca in rotation.new.values() if ca.key_pem)


# Parsing checks every RSA/ECDSA key (~0.3 s of CPU per bundle) and registering a secret derives all its
# encodings: both are memoised by the bytes' digest. Same bytes, same result: nothing decided is kept.
_MEMO_SIZE = 8
_bundles: dict[str, SecretsBundle] = {}
_rotations: dict[str, Rotation] = {}


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _parse_bundle(raw: bytes, source: str) -> SecretsBundle:
    key = _digest(raw)
    bundle = _bundles.get(key)
    if bundle is None:
        bundle = SecretsBundle.from_yaml(raw, source)
        SCRUBBER.register_all(bundle.secret_values())
        _remember(_bundles, key, bundle)
    return bundle


def _parse_rotation(raw: bytes) -> Rotation:
    key = _digest(raw)
    rotation = _rotations.get(key)
    if rotation is None:
        rotation = Rotation.from_yaml(raw)
        register_rotation(rotation)
        _remember(_rotations, key, rotation)
    return rotation


def _remember(memo: dict[str, Any], key: str, value: Any) -> None:
    if len(memo) >= _MEMO_SIZE:
        memo.pop(next(iter(memo)))
    memo[key] = value
