"""Reconcile one approved machine: render, read what the node runs, then converge or report.

    converged                              -> Ready=True/Converged
    a safe difference                      -> dry run, apply NO_REBOOT       -> Ready=True/Applied
    a reboot-requiring difference          -> never applied: rebootPaths     -> Ready=False/RebootRequired
    an API-server-restart difference (CP)  -> never applied: apiServerRestartPaths
                                                                             -> Ready=False/APIServerRestartRequired
       (on a worker it is applied like a safe change)
    unsupported change                     -> never applied                  -> Ready=False/UnsupportedChange
    a patch Talos's decoder refuses        -> never applied (unknown field, wrong type)
                                                                             -> Ready=False/InvalidConfig
    an operation's planned reboot / kube-apiserver restart under way, within its bound
                                           -> Ready=False/Rebooting (APIServerRestarting), a Normal Event;
                                              the node is not dialled (the operation watches it)
    the node runs another Talos contract   -> never applied (its Version's major.minor is not spec.talosVersion)
                                                                             -> Ready=False/ContractMismatch
    spec.address no <host>[:port]          -> Ready=False/InvalidAddress, a Warning; nothing dialled
    unreachable / render failure           -> Ready=False with the cause (a Warning MachineUnreachable: nobody
                                              planned it, or a planned one outlasted its bound)
    the bundle's CAs not among those the   -> never applied, whatever the difference -> Ready=False/BundleMismatch
      node trusts (its running config, or,    (no Event: the TalosCluster's Warning says it once;
      when it refuses the bundle's TLS       docs/decisions.md#bundle-belongs)
      credentials, status.trustedCAs)
    an operation holding the machines      -> Ready=Unknown, nothing else (docs/decisions.md#rotation-state):
      under way (its kind's holds_machines)   CARotationInProgress when its kind rotates the cluster's CAs,
                                              OperationUnderWay (its kind's title in the message) for any other

The reconciler never reboots and never restarts the API server behind anyone's back (docs/decisions.md#config-rollout):
a `config` operation rolls those out. It returns the status it wants; the actor writes it.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

import structlog

from ichord.api import contract_match, names
from ichord.api.conditions import Condition
from ichord.api.disruptions import Disruption, PlannedDisruption
from ichord.api.names import ReadyReason
from ichord.api.views import MachineView, OperationView
from ichord.contract import ContractMismatchError, runs_contract
from ichord.machines.memo import ConfigMemo
from ichord.pki.bundle import SecretsBundle
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import ConfigParseError, MachineConfig, plain_hash
from ichord.render.errors import RenderError
from ichord.render.fieldmeta import Classification, classify, summarize_paths
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.strict import InvalidConfigError
from ichord.render.trusted_cas import BundleCAs, NodeTrust, Refusal, describe_refusals, refusals
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.errors import (
    TalosCertificateError,
    TalosError,
    TalosFailedPreconditionError,
    TalosInvalidEndpointError,
    TalosUnreachableError,
)

log = structlog.get_logger("ichord.machines")

# Status fields this reconciler owns on a TalosMachine (everything else is left alone).
OWNED_FIELDS = ("rebootPaths", "apiServerRestartPaths", "nodeName", "configHash", "talosVersion", "trustedCAs")


@dataclass
class MachineResult:
    """What the machine's status should say, and when to look again."""

    ready: Condition
    fields: dict[str, Any] = field(default_factory=dict)
    event: tuple[str, str, str] | None = None  # (type, reason, message), posted on a transition
    requeue_after: float | None = None
    applied: bool = False


def _jittered(seconds: float) -> float:
    """+-10 %: machines that converged together must not all be read again in the same instant."""
    return seconds * random.uniform(0.9, 1.1)  # noqa: S311 - spreading load, not security


def _ready(status: str, reason: str, message: str) -> Condition:
    return Condition(names.READY, status, reason, message)


def _held(op: OperationView) -> Condition:
    """Ready while ``op`` holds the reconciler off the node: CARotationInProgress for a kind that rotates the
    cluster's CAs (the reason users and alerts know), OperationUnderWay for any other; its title in the message."""
    kind = op.description
    title = kind.title if kind is not None else f"an operation of kind {op.kind}"
    reason = (ReadyReason.CA_ROTATION_IN_PROGRESS if kind is not None and kind.rotates_cas
              else ReadyReason.OPERATION_UNDER_WAY)
    return _ready("Unknown", reason, f"{title} (TalosOperation {op.namespace}/{op.name}) is under way for this "
                                     "cluster; the machine is reconciled again when it completes")


def _error_message(exc: BaseException) -> str:
    return SCRUBBER.text(str(exc))


async def reconcile_machine(
    talos: TalosClient,
    bundle: SecretsBundle,
    cluster: ClusterInputs,
    machine: MachineView,
    *,
    held_by: OperationView | None,
    retry_after: float,
    resync_after: float,
    memo: ConfigMemo | None = None,
    planned: PlannedDisruption | None = None,
    now: dt.datetime | None = None,
    bundle_cas: BundleCAs | None = None,
) -> MachineResult:
    """One step of one machine; ``memo`` (the caller's, per cluster) spares re-deriving unchanged content.

    ``planned``: the reboot or kube-apiserver restart an operation has under way on this machine (from its markers
    in the API), judged against its bound at ``now``. ``held_by``: the operation under way whose kind holds the
    machine reconciler off the cluster's nodes, if any. ``bundle_cas``: the bundle Secret's CAs, rotation.yaml's new
    ones included (None: ``bundle``'s alone); a node that trusts none of them is never applied to."""
    now = now if now is not None else dt.datetime.now(dt.UTC)
    if planned is not None and not planned.overdue(now):
        return _planned(planned, retry_after)
    if held_by is not None:
        # Standing aside: no render, no dial, no apply (docs/decisions.md#rotation-state).
        return MachineResult(_held(held_by))
    memo = memo if memo is not None else ConfigMemo()  # none given: everything is derived afresh
    bundle_cas = bundle_cas if bundle_cas is not None else BundleCAs.of_bundle(bundle)
    try:
        inputs = MachineInputs.from_spec(machine.spec)
        rendered_hash = memo.rendered_hash(bundle, cluster, inputs)  # the same inputs render the same configuration
        if rendered_hash is None:
            # Only the hash outlives this line: no documents are held across the node's reads below.
            rendered_hash = plain_hash(render(bundle, cluster, inputs).plain())
            memo.remember_render(bundle, cluster, inputs, rendered_hash)
    except RenderError as exc:
        return _render_failed(exc)
    endpoint = machine.address
    try:
        running_bytes = await talos.machine_config(endpoint)
        known_bytes = memo.running(running_bytes)  # the same bytes read the same
        if known_bytes is None:
            plain = MachineConfig.plain_of(running_bytes)
            known_bytes = (plain_hash(plain), NodeTrust.of_config(plain))
            memo.remember_running(running_bytes, *known_bytes)
        running_hash, trust = known_bytes
        node_name = machine.hostname or await talos.nodename(endpoint)
        version = await talos.version(endpoint)
    except TalosInvalidEndpointError as exc:
        msg = (f"spec.address cannot be dialled, {exc.detail}; nothing was sent. Correct it: "
               f"`kubectl -n {machine.namespace} edit talosmachine {machine.name}`")
        return MachineResult(_ready("False", ReadyReason.INVALID_ADDRESS, msg),
                             event=("Warning", ReadyReason.INVALID_ADDRESS, msg))  # only an edit can fix it
    except (TalosUnreachableError, TalosCertificateError) as exc:
        recorded = NodeTrust.from_status(machine.status.get("trustedCAs"))
        refused = refusals(bundle_cas, recorded) if recorded is not None else ()
        if isinstance(exc, TalosCertificateError) and refused:
            # The node refuses the bundle's credentials and, as last read, trusts other CAs: not a fault of the
            # node, the bundle is not its own.
            return _mismatch(refused, "the node (as last read)", retry_after,
                             prefix=f"the node refused the bundle's TLS credentials ({_error_message(exc)}); ")
        msg = f"the Talos API at {endpoint} cannot be reached: {_error_message(exc)}"
        if planned is not None:  # planned, and past its bound: now it needs a person
            msg = (f"{planned.describe()} has not ended within {planned.bound:g} s; {msg}. The operation pauses "
                   f"at the same bound: see `kubectl describe talosoperation -n {planned.operation.split('/')[0]} "
                   f"{planned.operation.split('/', 1)[1]}`")
        return MachineResult(
            _ready("False", ReadyReason.UNREACHABLE, msg),
            event=("Warning", names.EventReason.MACHINE_UNREACHABLE, msg),
            requeue_after=retry_after,
        )
    except (TalosError, ConfigParseError) as exc:
        msg = f"cannot read the node's configuration: {_error_message(exc)}"
        return MachineResult(_ready("False", ReadyReason.UNREACHABLE, msg), requeue_after=retry_after)

    base = {"nodeName": node_name, "talosVersion": version.tag, "configHash": rendered_hash,
            "trustedCAs": trust.as_status()}
    if not runs_contract(version.tag, cluster.contract):
        # Rendered for another Talos than the node runs: neither compared nor classified, nothing applied
        # (docs/decisions.md#contract-match).
        return _contract_mismatch(version.tag, cluster, machine, base, retry_after)
    refused = refusals(bundle_cas, trust)
    if refused:  # before any classification or apply: another cluster's CAs would lock the node out
        return _mismatch(refused, "its running configuration", retry_after, fields={
            "nodeName": node_name, "talosVersion": version.tag, "trustedCAs": trust.as_status()})
    converged = running_hash == rendered_hash  # the common case, converged, needs no more
    rendered: MachineConfig | None = None
    contract, role = str(cluster.contract), machine.role
    known = None if converged else memo.classification(running_bytes, rendered_hash, contract, role)
    if known is not None:
        # The same bytes against the same render classified before: a difference that is only reported (a reboot
        # waiting for its rollout) is reported again without the render, the parse and the diff.
        decided = _report_only(known, machine)
        if decided is not None:
            decided.fields = {**base, **decided.fields}
            decided.requeue_after = _jittered(resync_after)
            return decided
    if not converged:
        # A difference: render again for the comparison and the classification (both parsed fine above).
        # Equal plain forms can still hash apart (1 and 1.0): the plain comparison decides, as it always has.
        try:
            rendered = render(bundle, cluster, inputs)
        except RenderError as exc:
            return _render_failed(exc)
        converged = MachineConfig.plain_of(running_bytes) == rendered.plain()
    if converged or rendered is None:  # rendered is None exactly when the hashes matched
        return MachineResult(
            _ready("True", ReadyReason.CONVERGED, "the node runs the rendered configuration"),
            fields={**base, "rebootPaths": [], "apiServerRestartPaths": []},
            requeue_after=_jittered(resync_after),
        )

    try:
        running = MachineConfig.parse(running_bytes)  # round-trip documents, for the field-by-field classification
    except ConfigParseError as exc:
        msg = f"cannot read the node's configuration: {_error_message(exc)}"
        return MachineResult(_ready("False", ReadyReason.UNREACHABLE, msg), requeue_after=retry_after)
    result = classify(running, rendered, cluster.contract, machine.role)
    memo.remember_classification(running_bytes, rendered_hash, contract, role, result)
    decided = _report_only(result, machine)
    if decided is not None:
        decided.fields = {**base, **decided.fields}
        decided.requeue_after = _jittered(resync_after)
        return decided

    try:
        await talos.apply_configuration(endpoint, rendered.wire_bytes(), ApplyMode.NO_REBOOT, dry_run=True,
                                        contract=cluster.contract)
        applied = await talos.apply_configuration(endpoint, rendered.wire_bytes(), ApplyMode.NO_REBOOT,
                                                  contract=cluster.contract)
    except ContractMismatchError as exc:  # the node changed under the read above (a new connection, a new boot)
        return _contract_mismatch(exc.running, cluster, machine, base, retry_after)
    except TalosFailedPreconditionError:
        # another apply is running on the node (talosctl, or a rotation's): look again shortly
        return MachineResult(
            _ready("Unknown", ReadyReason.APPLY_FAILED, "another configuration apply is in progress"),
            fields=base,
            requeue_after=retry_after,
        )
    except (TalosUnreachableError, TalosCertificateError) as exc:
        msg = f"the Talos API at {endpoint} cannot be reached: {_error_message(exc)}"
        return MachineResult(_ready("False", ReadyReason.UNREACHABLE, msg), requeue_after=retry_after)
    except TalosError as exc:
        msg = f"the node refused the configuration: {_error_message(exc)}"
        return MachineResult(
            _ready("False", ReadyReason.APPLY_FAILED, msg),
            fields=base,
            event=("Warning", ReadyReason.APPLY_FAILED, msg),
            requeue_after=retry_after,
        )
    paths = [c.path for c in result.changes]
    message = f"applied without a reboot ({applied.mode_name}); {summarize_paths(paths)}"
    log.info("configuration applied", machine=machine.name, cluster=f"{machine.namespace}/{machine.cluster}",
             fields=len(paths))
    return MachineResult(
        _ready("True", ReadyReason.APPLIED, message),
        fields={**base, "rebootPaths": [], "apiServerRestartPaths": []},
        event=("Normal", names.EventReason.CONFIG_APPLIED, message),
        requeue_after=0.0,  # verify on the next step that the node runs it
        applied=True,
    )


def _mismatch(refused: tuple[Refusal, ...], where: str, retry_after: float, *, prefix: str = "",
              fields: dict[str, Any] | None = None) -> MachineResult:
    msg = (f"{prefix}{describe_refusals(refused, where)}: the bundle Secret holds CAs this node does not trust "
           "(another cluster's?); nothing was applied. See the TalosCluster's Ready")
    # No reboot or restart paths stay behind for a config rollout to plan: it would roll the bundle out.
    return MachineResult(_ready("False", ReadyReason.BUNDLE_MISMATCH, msg),
                         fields={"rebootPaths": [], "apiServerRestartPaths": [], **(fields or {})},
                         requeue_after=retry_after)


def _planned(planned: PlannedDisruption, retry_after: float) -> MachineResult:
    """A disruption ichord asked for: said as such, with a Normal Event; the node is left to the operation."""
    if planned.what is Disruption.REBOOT:
        reason, event = ReadyReason.REBOOTING, names.EventReason.MACHINE_REBOOTING
        msg = (f"rebooting: {planned.describe()}; the machine is reconciled again once the operation has seen it "
               f"back (a Warning only if it is not back within {planned.bound:g} s)")
    else:
        reason, event = ReadyReason.API_SERVER_RESTARTING, names.EventReason.MACHINE_API_SERVER_RESTARTING
        msg = (f"kube-apiserver restarting: {planned.describe()}; the machine is reconciled again once the operation "
               f"has seen it Ready (a Warning only if it is not within {planned.bound:g} s)")
    return MachineResult(_ready("False", reason, msg), event=("Normal", event, msg), requeue_after=retry_after)


def _contract_mismatch(running: str, cluster: ClusterInputs, machine: MachineView, base: dict[str, Any],
                       retry_after: float) -> MachineResult:
    """Ready=False naming both versions and the way out, a Warning (a person must choose); no paths reported: they
    would be of a render for another Talos. Read again at the retry: an upgrade of the node sends no event."""
    msg = contract_match.machine_message(running, cluster.contract, cluster=machine.cluster,
                                         namespace=machine.namespace)
    return MachineResult(
        _ready("False", ReadyReason.CONTRACT_MISMATCH, msg),
        fields={**base, "rebootPaths": [], "apiServerRestartPaths": []},
        event=("Warning", names.EventReason.CONTRACT_MISMATCH, msg),
        requeue_after=retry_after,
    )


def _render_failed(exc: RenderError) -> MachineResult:
    if isinstance(exc, InvalidConfigError):
        # Talos would refuse it: reported before any classification, so nothing is applied or planned.
        msg = f"the configuration is invalid, nothing was applied: {_error_message(exc)}"
        return MachineResult(
            _ready("False", ReadyReason.INVALID_CONFIG, msg),
            fields={"rebootPaths": [], "apiServerRestartPaths": []},
            event=("Warning", names.EventReason.INVALID_CONFIG, msg),
        )
    return MachineResult(
        _ready("False", ReadyReason.RENDER_FAILED, f"cannot render the configuration: {_error_message(exc)}"),
        event=(
            "Warning",
            names.EventReason.RENDER_FAILED,
            f"cannot render the configuration: {_error_message(exc)}",
        ),
    )


def _report_only(result: Classification, machine: MachineView) -> MachineResult | None:
    """The differences that are reported and never applied; None when the change may be applied."""
    if result.unsupported:
        items = [f"{u.path} ({u.reason})" for u in result.unsupported]
        msg = (
            "the rendered configuration differs in a way a running node cannot take: "
            + "; ".join(items[:3])
            + (f"; and {len(items) - 3} more" if len(items) > 3 else "")
        )
        return MachineResult(_ready("False", ReadyReason.UNSUPPORTED_CHANGE, msg))
    if result.reboot_paths:
        paths = list(result.reboot_paths)
        msg = (
            f"{len(paths)} change(s) need a reboot and were not applied ({summarize_paths(paths)}); "
            f"roll them out one node at a time with a TalosOperation of kind config: `ichord cluster config-apply "
            f"{machine.cluster} -n {machine.namespace}`"
        )
        return MachineResult(
            _ready("False", ReadyReason.REBOOT_REQUIRED, msg),
            fields={"rebootPaths": paths, "apiServerRestartPaths": list(result.api_server_restart_paths)},
            event=("Warning", names.EventReason.REBOOT_REQUIRED, msg),
        )
    if result.api_server_restart_paths and machine.is_control_plane:
        paths = list(result.api_server_restart_paths)
        msg = (
            f"{len(paths)} change(s) restart kube-apiserver and were not applied ({summarize_paths(paths)}); "
            f"roll them out one control plane at a time with a TalosOperation of kind config: `ichord cluster "
            f"config-apply {machine.cluster} -n {machine.namespace}`"
        )
        return MachineResult(
            _ready("False", ReadyReason.API_SERVER_RESTART_REQUIRED, msg),
            fields={"rebootPaths": [], "apiServerRestartPaths": paths},
            event=("Warning", names.EventReason.API_SERVER_RESTART_REQUIRED, msg),
        )
    return None
