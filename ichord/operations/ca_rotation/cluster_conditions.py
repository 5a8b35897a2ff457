"""The TalosCluster conditions a CA rotation raises (docs/decisions.md#bundle-backup-stale and its amendments).

- BundleBackupStale (reason CARotated) and a Warning Event naming the export command: the bundle on
  the operator's machine describes a PKI no node accepts any more.
- CAClientsNotRestarted: True when a restarted client was not back within the bound, False when a
  rotation's clients all came back.
"""

from __future__ import annotations

import shlex

from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import BundleBackupStaleReason, CAClientsNotRestartedReason
from ichord.kube import crds
from ichord.kube.events import ObjectRef
from ichord.kube.status import update_status
from ichord.operations.ca_rotation.status import ca_status
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.pki.rotation import Target
from ichord.pki.scrub import SCRUBBER

#: Where ``ichord cluster credentials`` writes the kubeconfig by default (ichord.credentials.DEFAULT_CREDENTIALS_DIR).
MINTED_KUBECONFIG = "~/.ichord/clusters/{name}/kubeconfig"


def minted_kubeconfig(op: Obj, cluster: str) -> str:
    """The kubeconfig the hand-off wrote, as a shell takes it: the path ``ichord cluster credentials`` recorded
    with its acknowledgement (quoted: an annotation is input), else its default place."""
    recorded = str(((op.get("metadata") or {}).get("annotations") or {}).get(
        names.CREDENTIALS_KUBECONFIG_ANNOTATION) or "")
    if not recorded:
        return MINTED_KUBECONFIG.format(name=cluster)
    if recorded.startswith("~/"):
        return "~/" + shlex.quote(recorded[2:])
    return shlex.quote(recorded)


def export_command(ctx: StepContext, inputs: Inputs) -> str:
    """The export command as it works pasted: with the cluster's namespace and, when the Kubernetes CA of the API
    server ichord (and so the operator) talks to was rotated, the kubeconfig ``ichord cluster credentials`` minted:
    the operator's old one is refused from Dropping on (docs/decisions.md#self-managed-kubeconfig)."""
    name = inputs.cluster_name
    command = f"ichord cluster bundle-export {name} -n {inputs.op_namespace}"
    rotation = inputs.rotation
    rotated = Target.KUBERNETES.value in (ca_status(inputs).get("targets") or []) or (
        rotation is not None and Target.KUBERNETES in rotation.new)
    if rotated:
        cas = [inputs.bundle.k8s.cert_pem]
        if rotation is not None and Target.KUBERNETES in rotation.new:
            cas.append(rotation.new[Target.KUBERNETES].cert_pem)
        if any(ctx.own_cluster(ca) for ca in cas):
            command += f" --kubeconfig {minted_kubeconfig(inputs.op, name)}"
    return command


async def _set_cluster_condition(ctx: StepContext, inputs: Inputs, cond: Condition) -> bool:
    """Set a TalosCluster condition; True when it changed."""
    changed = False

    def mutate(status: Obj, _obj: Obj) -> Obj:
        nonlocal changed
        old = find(status.get("conditions"), cond.type)
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
                cond.status, cond.reason, SCRUBBER.text(cond.message)):
            return status
        changed = True
        status["conditions"] = set_condition(status.get("conditions"), cond, now=ctx.now())
        return status

    inputs.cluster = await update_status(crds.clusters(ctx.kube), inputs.op_namespace, inputs.cluster_name, mutate)
    return changed


async def raise_backup_stale(ctx: StepContext, inputs: Inputs) -> None:
    name = inputs.cluster_name
    message = (f"the CAs of cluster {name} were rotated by operation {inputs.name}; the exported secrets bundle is "
               f"stale: run `{export_command(ctx, inputs)}`")
    cond = Condition(names.BUNDLE_BACKUP_STALE, "True", BundleBackupStaleReason.CA_ROTATED, message)
    if await _set_cluster_condition(ctx, inputs, cond):
        ctx.recorder.record(ObjectRef.of(inputs.cluster), "Warning", names.EventReason.BUNDLE_BACKUP_STALE, message)


async def set_clients_not_restarted(ctx: StepContext, inputs: Inputs, not_back: list[str]) -> None:
    if not_back:
        message = (f"after CA rotation {inputs.name} these clients were not available again within the bound: "
                   f"{', '.join(not_back)}; restart their pods if they report x509 errors")
        cond = Condition(names.CA_CLIENTS_NOT_RESTARTED, "True", CAClientsNotRestartedReason.NOT_BACK, message)
    else:
        message = f"every client CA rotation {inputs.name} restarted is available again"
        cond = Condition(names.CA_CLIENTS_NOT_RESTARTED, "False", CAClientsNotRestartedReason.ALL_BACK, message)
    if await _set_cluster_condition(ctx, inputs, cond) and not_back:
        ctx.recorder.record(ObjectRef.of(inputs.cluster), "Warning", names.EventReason.CA_CLIENTS_NOT_RESTARTED,
                            message)
