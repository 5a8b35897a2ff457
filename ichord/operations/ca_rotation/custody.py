"""Key custody: from the moment a rotation's new CA keys exist until the bundle Secret holds them as current, they are
never in only one object that one ``kubectl delete`` removes.

    the save (stage "")   the custody copy first: a Secret of ichord's own, ``ichord-custody-<operation UID>`` in the
                          operation's namespace, type ichor.maesh.dev/ca-custody, owned by the TalosOperation
                          (ownerReference: the garbage collector removes it with the operation), holding the
                          secrets.yaml the rotation starts from and its rotation.yaml, and naming the bundle Secret;
                          then rotation.yaml AND the finalizer ichor.maesh.dev/ca-custody in one update of the bundle
                          Secret. A start killed between the two adopts the copy's keys (none are generated twice).
    every step            the bundle Secret is checked against status (the new CAs' fingerprints in rotation.yaml, the
                          old ones in secrets.yaml, secrets.yaml unchanged since the start; from Finalizing on the new
                          CAs in secrets.yaml); a Secret deleted (gone, or held by the finalizer), emptied of
                          rotation.yaml or replaced by an older secrets.yaml pauses the rotation with
                          CARotation=False/BundleRestoreRequired naming the copy and the one command that restores the
                          Secret from it, ``ichord cluster restore-bundle NAME -n NS`` (``restore``). A missing copy or
                          finalizer is put back (a rotation started by an older ichord).
    Done, or abandon      the finalizer removed, then the copy deleted (``release``).

The copy's values are never logged, put in status, an Event or an error: only its name is. Failpoints:
``ca-rotation.custody.kept`` (the copy written, the bundle Secret not yet), ``ca-rotation.custody.restored`` (the
Secret found restored, the condition not yet cleared) and ``ca-rotation.custody.released`` (the finalizer gone, the
copy not yet deleted).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.conditions import find
from ichord.api.names import CARotationReason, EventReason
from ichord.api.views import OperationView
from ichord.failpoints import failpoint
from ichord.kube.client import KubeClient
from ichord.kube.errors import AlreadyExists, Conflict, KubeError, NotFound, translate
from ichord.kube.reads import SecretData
from ichord.operations import backbone
from ichord.operations.bundle_source import full_bundle, parse_rotation
from ichord.operations.ca_rotation.bundle_secret import BundleSecretError
from ichord.operations.ca_rotation.plan import replaced_by
from ichord.operations.ca_rotation.status import CA_ROTATION, ca_status
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Blocked
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.pki.scrub import SCRUBBER

FINALIZER = names.BUNDLE_CUSTODY_FINALIZER
#: Attempts of a Secret update against a moving object (each conflict re-reads it).
_ATTEMPTS = 5
#: Stages in which the bundle Secret holds the new CAs in rotation.yaml (before the replacement).
_PENDING = (Stage.ACCEPTING, Stage.AWAITING_CREDENTIALS, Stage.ISSUING, Stage.DROPPING)


class CustodyError(BundleSecretError):
    """The custody copy or the bundle Secret could not be written as custody needs; the step is retried."""


def copy_name(op_uid: str) -> str:
    """The custody copy of the operation with this UID (unique, stable across restarts and renames)."""
    return f"ichord-custody-{op_uid}"


def restore_command(cluster: str, namespace: str) -> str:
    return f"ichord cluster restore-bundle {cluster} -n {namespace}"


def _secret_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _decode(obj: Obj, key: str) -> bytes | None:
    raw = (obj.get("data") or {}).get(key)
    return None if raw is None else base64.b64decode(raw)


async def get_secret(kube: KubeClient, namespace: str, name: str) -> Obj | None:
    try:
        with translate():
            obj: Obj = await kube.raw("GET", _secret_path(namespace, name))
    except NotFound:
        return None
    return obj


# ---- the copy ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """The custody copy as read: the secrets.yaml the rotation started from, its rotation.yaml, the bundle Secret."""

    namespace: str
    name: str
    uid: str
    secrets: bytes
    rotation_yaml: bytes | None
    bundle_namespace: str
    bundle_name: str

    def __repr__(self) -> str:  # never print the keys
        return f"Kept({self.namespace}/{self.name} of bundle {self.bundle_namespace}/{self.bundle_name})"

    @property
    def where(self) -> str:
        return f"Secret {self.namespace}/{self.name}"

    def rotation(self) -> Rotation | None:
        return None if self.rotation_yaml is None else parse_rotation(self.rotation_yaml)

    def restored(self, stage: Stage) -> dict[str, bytes | None]:
        """What the bundle Secret must hold at ``stage``: key -> bytes (None: the key must be absent).

        Before Finalizing the secrets.yaml the rotation started from and its rotation.yaml; from Finalizing on the
        bundle with the new CAs (what the replacement wrote: the same parse of the same bytes, the same new CAs)."""
        if stage in _PENDING or self.rotation_yaml is None:
            return {names.SECRETS_KEY: self.secrets,
                    names.ROTATION_KEY: self.rotation_yaml if stage in _PENDING else None}
        rotation = self.rotation()
        assert rotation is not None
        replaced = rotation.apply_to(full_bundle(self.secrets, f"{self.where} key {names.SECRETS_KEY}"))
        return {names.SECRETS_KEY: replaced.to_yaml().encode(), names.ROTATION_KEY: None}


def _kept_of(obj: Obj, op_uid: str) -> Kept | None:
    meta = obj.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("uid") == op_uid]
    secrets = _decode(obj, names.SECRETS_KEY)
    if obj.get("type") != names.CUSTODY_SECRET_TYPE or not owners or secrets is None:
        return None  # not this operation's copy: never trusted, never overwritten
    bundle_ref = str((meta.get("annotations") or {}).get(names.CUSTODY_BUNDLE_ANNOTATION) or "")
    bundle_ns, _, bundle_name = bundle_ref.partition("/")
    return Kept(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""), secrets,
                _decode(obj, names.ROTATION_KEY), bundle_ns, bundle_name)


async def read_copy(kube: KubeClient, namespace: str, op_uid: str) -> Kept | None:
    """The operation's custody copy (None when there is none, or the Secret of that name is not its copy)."""
    obj = await get_secret(kube, namespace, copy_name(op_uid))
    return None if obj is None else _kept_of(obj, op_uid)


def _copy_body(op: Obj, bundle_ns: str, bundle_name: str, secrets: bytes, rotation_yaml: bytes) -> Obj:
    view = OperationView.of(op)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": names.CUSTODY_SECRET_TYPE,
        "metadata": {
            "name": copy_name(view.uid), "namespace": view.namespace,
            "labels": {names.CUSTODY_OF_LABEL: view.name},
            "annotations": {names.CUSTODY_BUNDLE_ANNOTATION: f"{bundle_ns}/{bundle_name}"},
            # No blockOwnerDeletion: deleting the operation is how a rotation is abandoned, never blocked by this.
            "ownerReferences": [{"apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION, "name": view.name,
                                 "uid": view.uid, "controller": True}],
        },
        "data": {names.SECRETS_KEY: _b64(secrets), names.ROTATION_KEY: _b64(rotation_yaml)},
    }


async def keep(kube: KubeClient, op: Obj, bundle_ns: str, bundle_name: str, secrets: bytes,
               rotation_yaml: bytes) -> None:
    """The custody copy holds exactly ``secrets`` and ``rotation_yaml`` (created, or its data replaced)."""
    body = _copy_body(op, bundle_ns, bundle_name, secrets, rotation_yaml)
    meta = body["metadata"]
    try:
        with translate():
            await kube.raw("POST", _secret_path(meta["namespace"]), body=body)
        return
    except (AlreadyExists, Conflict):  # a start that died after writing it, or the name is taken
        pass
    except KubeError as exc:
        raise CustodyError(f"cannot write the custody copy Secret {meta['namespace']}/{meta['name']}: "
                           f"{SCRUBBER.exception(exc)}") from None
    current = await get_secret(kube, meta["namespace"], meta["name"])
    if current is None or _kept_of(current, OperationView.of(op).uid) is None:
        raise CustodyError(f"Secret {meta['namespace']}/{meta['name']} exists and is not this operation's custody "
                           "copy; the rotation does not start until it is removed")
    if current.get("data") == body["data"]:
        return
    current["data"] = body["data"]
    try:
        with translate():
            await kube.raw("PUT", _secret_path(meta["namespace"], meta["name"]), body=current)
    except KubeError as exc:
        raise CustodyError(f"cannot write the custody copy Secret {meta['namespace']}/{meta['name']}: "
                           f"{SCRUBBER.exception(exc)}") from None


# ---- the save (the start's one write of new keys) ----------------------------------------------------


@dataclass(frozen=True)
class Saved:
    rotation: Rotation
    adopted: bool  # the keys were already saved (a start that died after the copy or after the Secret)


async def save(kube: KubeClient, op: Obj, namespace: str, name: str, targets: tuple[Target, ...], *,
               generate: Any = generate_rotation) -> Saved:
    """The custody copy, then rotation.yaml with the finalizer in the bundle Secret (one update refused if the Secret
    changed); a rotation.yaml already in the Secret, or in the copy, is adopted, never overwritten."""
    obj = await get_secret(kube, namespace, name)
    if obj is None:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} does not exist")
    secrets = _decode(obj, names.SECRETS_KEY)
    if secrets is None:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} has no {names.SECRETS_KEY}")
    existing = _decode(obj, names.ROTATION_KEY)
    view = OperationView.of(op)
    if existing is not None:
        rotation, raw, adopted = Rotation.from_yaml(existing), existing, True
    else:
        kept = await read_copy(kube, view.namespace, view.uid)
        kept_rotation = kept.rotation() if kept is not None else None
        if kept_rotation is not None and set(kept_rotation.targets) == set(targets):
            rotation, adopted = kept_rotation, True
        else:
            rotation, adopted = generate(targets), False
        raw = rotation.to_yaml().encode()
    SCRUBBER.register_all(ca.key_pem for ca in rotation.new.values() if ca.key_pem)
    await keep(kube, op, namespace, name, secrets, raw)
    failpoint("ca-rotation.custody.kept")
    finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
    if existing is None or FINALIZER not in finalizers:
        body = copy.deepcopy(obj)
        body.setdefault("data", {})[names.ROTATION_KEY] = _b64(raw)
        body["metadata"]["finalizers"] = [*[f for f in finalizers if f != FINALIZER], FINALIZER]
        await _put_bundle(kube, namespace, name, body)
    return Saved(rotation, adopted)


async def _put_bundle(kube: KubeClient, namespace: str, name: str, body: Obj) -> None:
    try:
        with translate():
            await kube.raw("PUT", _secret_path(namespace, name), body=body)
    except Conflict:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} changed while it was written; "
                                "the step runs again on a fresh read") from None
    except KubeError as exc:
        raise BundleSecretError(f"cannot write the bundle Secret {namespace}/{name}: "
                                f"{SCRUBBER.exception(exc)}") from None


# ---- every step ---------------------------------------------------------------------------------------


def bundle_problem(secret: SecretData, bundle: SecretsBundle, rotation: Rotation | None, ca_status: Obj,
                   stage: Stage, kept: Kept | None) -> str | None:
    """Why the bundle Secret no longer holds what this rotation needs at ``stage`` (None: it does)."""
    where = f"the bundle Secret {secret.namespace}/{secret.name}"
    if secret.deleting:
        return f"{where} is being deleted (the finalizer {FINALIZER} holds it while it holds the rotation's keys)"
    certs = [c for c in ca_status.get("certificates") or [] if c.get("next")]
    if stage not in _PENDING:
        if replaced_by(bundle, certs):
            return None
        return f"{where}'s {names.SECRETS_KEY} does not hold the new CAs this rotation put there"
    if rotation is None:
        if stage is Stage.DROPPING and replaced_by(bundle, certs):
            return None  # replaced, status not told yet (the pass moves on to Finalizing)
        return f"{where} holds no {names.ROTATION_KEY} although the rotation is in {stage.value}"
    by_name = {str(c.get("name")): c for c in certs}
    for t, ca in rotation.new.items():
        entry = by_name.get(t.value)
        if entry is None or entry.get("next") != ca_fingerprint(ca):
            return f"{where}'s {names.ROTATION_KEY} holds other CAs than the ones this rotation gave the nodes"
    for name, entry in by_name.items():
        target = Target(name)
        if entry.get("previous") and ca_fingerprint(bundle.ca(target.ca_kind)) != entry["previous"]:
            return (f"{where}'s {names.SECRETS_KEY} holds other CAs than the ones this rotation started from (an older "
                    f"or another cluster's {names.SECRETS_KEY}?)")
    if kept is not None and kept.secrets != secret.data.get(names.SECRETS_KEY):
        return f"{where}'s {names.SECRETS_KEY} is not the one this rotation started from"
    return None


def restore_message(problem: str, op_namespace: str, op_uid: str, cluster: str, kept: bool) -> str:
    copy_ref = f"Secret {op_namespace}/{copy_name(op_uid)}"
    if kept:
        return (f"{problem}. The rotation's keys are kept in the custody copy {copy_ref} (owned by this operation): "
                f"restore the bundle Secret from it with `{restore_command(cluster, op_namespace)}`; the rotation then "
                "goes on with the same new CAs. Nothing is applied until then")
    return (f"{problem}, and the custody copy {copy_ref} does not exist: restore the bundle Secret from a backup "
            f"that holds this rotation's keys (status.caRotation.certificates names their fingerprints). Nothing is "
            "applied until then")


async def restore_required(ctx: StepContext, op: Obj, message: str) -> Blocked:
    """Paused, CARotation=False/BundleRestoreRequired with ``message``; one Warning while the message stays."""
    before = OperationView.of(op).condition(names.CA_ROTATION)
    outcome = await backbone.blocked_before_read(ctx, CA_ROTATION, op, message,
                                                 reason=CARotationReason.BUNDLE_RESTORE_REQUIRED,
                                                 event_reason=EventReason.BUNDLE_RESTORE_REQUIRED)
    if before is None or before.get("message") != SCRUBBER.text(message):
        backbone.log.warning("ca-rotation: the bundle Secret must be restored", operation=OperationView.of(op).name,
                             namespace=OperationView.of(op).namespace)
    return outcome


async def check(ctx: StepContext, inputs: Inputs, stage: Stage) -> Blocked | None:
    """The bundle Secret still holds the rotation's keys (else BundleRestoreRequired); the copy and the finalizer
    are in place (put back when missing)."""
    kept = await read_copy(ctx.kube, inputs.op_namespace, inputs.uid)
    problem = bundle_problem(inputs.secret, inputs.bundle, inputs.rotation, ca_status(inputs), stage, kept)
    if problem is not None:
        return await restore_required(ctx, inputs.op, restore_message(problem, inputs.op_namespace, inputs.uid,
                                                                      inputs.cluster_name, kept is not None))
    if kept is None and stage in _PENDING and inputs.rotation is not None:
        raw_rotation = inputs.secret.data.get(names.ROTATION_KEY)
        assert raw_rotation is not None
        await keep(ctx.kube, inputs.op, inputs.secret.namespace, inputs.secret.name,
                   inputs.secret.data[names.SECRETS_KEY], raw_rotation)
    if FINALIZER not in inputs.secret.finalizers and stage is not Stage.DONE:
        await _hold_bundle(ctx.kube, inputs.secret.namespace, inputs.secret.name)
    if restore_condition(inputs.op):  # restored: say so once, the stage's own step takes over from here
        failpoint("ca-rotation.custody.restored")
        message = f"the bundle Secret holds this rotation's keys again; going on in {stage.value}"
        await backbone.write(ctx, inputs, *backbone.in_progress(ctx, CA_ROTATION, CARotationReason.IN_PROGRESS,
                                                                message))
        backbone.event(ctx, inputs, "Normal", EventReason.OPERATION_RESUMED, message)
    return None


async def lost(ctx: StepContext, op: Obj, stage: Stage, missing: bool) -> Blocked:
    """The step could not read the bundle (``missing``: gone; else not a usable bundle) while the rotation is under
    way. The bundle reader's own advice (create it from secrets.yaml) would lose the new keys: never repeated."""
    view = OperationView.of(op)
    kept = await read_copy(ctx.kube, view.namespace, view.uid)
    ref = f" {kept.bundle_namespace}/{kept.bundle_name}" if kept is not None and kept.bundle_name else ""
    problem = (f"the bundle Secret{ref} was deleted while the rotation is in {stage.value}" if missing else
               f"the bundle Secret{ref} no longer holds a usable {names.SECRETS_KEY} and {names.ROTATION_KEY} "
               f"(the rotation is in {stage.value})")
    return await restore_required(ctx, op, restore_message(problem, view.namespace, view.uid, view.cluster or "",
                                                           kept is not None))


async def _hold_bundle(kube: KubeClient, namespace: str, name: str) -> None:
    for _ in range(_ATTEMPTS):
        obj = await get_secret(kube, namespace, name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if FINALIZER in finalizers:
            return
        obj["metadata"]["finalizers"] = [*finalizers, FINALIZER]
        try:
            with translate():
                await kube.raw("PUT", _secret_path(namespace, name), body=obj)
            return
        except Conflict:
            continue


async def drop_finalizer(kube: KubeClient, namespace: str, name: str) -> None:
    """The custody finalizer off the bundle Secret (idempotent; a Secret gone is fine)."""
    for _ in range(_ATTEMPTS):
        obj = await get_secret(kube, namespace, name)
        if obj is None:
            return
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        obj["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
        try:
            with translate():
                await kube.raw("PUT", _secret_path(namespace, name), body=obj)
            return
        except Conflict:
            continue
        except NotFound:
            return
    raise CustodyError(f"the bundle Secret {namespace}/{name} kept changing while its finalizer was removed")


# ---- the end ---------------------------------------------------------------------------------------------


async def release(kube: KubeClient, op: Obj, bundle: tuple[str, str] | None = None) -> None:
    """Done or abandoned: the bundle Secret's finalizer removed, then the custody copy deleted (idempotent)."""
    view = OperationView.of(op)
    kept = await read_copy(kube, view.namespace, view.uid)
    ref = bundle or ((kept.bundle_namespace, kept.bundle_name) if kept is not None and kept.bundle_name else None)
    if ref is not None:
        await drop_finalizer(kube, *ref)
    failpoint("ca-rotation.custody.released")
    if kept is None:
        return
    try:
        with translate():
            await kube.raw("DELETE", _secret_path(kept.namespace, kept.name),
                           body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": kept.uid}})
    except (NotFound, Conflict):
        return  # gone already, or replaced by another object of that name


def restore_condition(op: Obj) -> bool:
    cond = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION)
    return cond is not None and cond.get("reason") == CARotationReason.BUNDLE_RESTORE_REQUIRED
