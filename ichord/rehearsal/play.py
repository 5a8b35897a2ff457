"""The whole ``ichord cluster rehearse``: check the operation, read the live cluster, play it on the twin."""

from __future__ import annotations

import re
from typing import Any

from ichord.api import names
from ichord.api.operation_kinds import describe
from ichord.api.views import OperationView
from ichord.contract import UnsupportedContractError, VersionContract, parse_contract
from ichord.kube.client import KubeClient
from ichord.operations.config.plan import Refusal
from ichord.rehearsal.live import LiveCluster, RehearsalInputError, read_live
from ichord.rehearsal.model import Durations, predict
from ichord.rehearsal.report import Report
from ichord.rehearsal.run import TIME_SCALE, Player, simulated_delays, timing
from ichord.rehearsal.twin import Twin
from ichord.settings import Timing
from ichord.talos.client import TalosClient

Obj = dict[str, Any]
#: A Kubernetes object name (an RFC 1123 subdomain), as the live API server checks it on create.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_operation(doc: Any, namespace: str, cluster: str) -> Obj:
    """The TalosOperation to rehearse, or RehearsalInputError saying what is wrong with it (exit 2)."""
    if not isinstance(doc, dict) or doc.get("kind") != names.TALOS_OPERATION:
        raise RehearsalInputError(f"the file must hold one {names.TALOS_OPERATION} ({names.API_VERSION}); "
                                  "nothing was written")
    if doc.get("apiVersion") not in (None, names.API_VERSION):
        raise RehearsalInputError(f"apiVersion {doc.get('apiVersion')!r}: ichord serves {names.API_VERSION}")
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise RehearsalInputError("metadata and spec must be mappings")
    ref = (spec.get("clusterRef") or {}).get("name") if isinstance(spec.get("clusterRef"), dict) else None
    if ref != cluster:
        raise RehearsalInputError(f"spec.clusterRef.name is {ref!r}, not the cluster rehearsed ({cluster!r})")
    if meta.get("namespace") not in (None, namespace):
        raise RehearsalInputError(f"metadata.namespace {meta.get('namespace')!r} is not the cluster's ({namespace})")
    if describe(str(spec.get("kind") or "")) is None:
        raise RehearsalInputError(f"spec.kind {spec.get('kind')!r} is not an operation kind ichord runs")
    name = str(meta.get("name") or f"{cluster}-rehearsal")
    if len(name) > 253 or not _OBJECT_NAME.fullmatch(name):  # the twin's API server does not check names
        raise RehearsalInputError(f"metadata.name {name!r} is not a name the API server accepts (lower-case "
                                  "letters, digits, '-' and '.', starting and ending with a letter or digit)")
    return {**doc, "apiVersion": names.API_VERSION, "metadata": {"name": name}}


def _contract(live: LiveCluster) -> VersionContract:
    text = str((live.cluster.get("spec") or {}).get("talosVersion") or "")
    if not text:
        text = next(iter(live.nodes.values())).talos_version
    try:
        return parse_contract(text)
    except UnsupportedContractError as exc:
        raise RehearsalInputError(f"TalosCluster {live.namespace}/{live.name}: {exc}") from None


async def rehearse(kube: KubeClient, namespace: str, cluster: str, operation: Obj, durations: Durations, *,
                   talos_factory: Any = TalosClient, budget: float = 240.0, settings: Timing | None = None) -> Report:
    """Read the live cluster, build its twin, play ``operation`` on it, and predict (the whole command).
    ``settings``: the live daemon's Timing (its waits by the clock); the environment's (``ICHORD_TIME_SCALE``) when
    None."""
    op = check_operation(operation, namespace, cluster)
    live = await read_live(kube, namespace, cluster, talos_factory)
    durations = durations.with_history(live.operations)  # this cluster's own past steps, where it has any
    durations = durations.with_settings(settings or Timing.from_env())  # the daemon's, as this environment sets it
    unfinished = [OperationView.of(o) for o in live.operations if not OperationView.of(o).finished]
    if unfinished:
        other = unfinished[0]
        return Report.refused(live, op, durations, Refusal.OPERATION_UNFINISHED,
                              f"TalosOperation {namespace}/{other.name} ({other.phase or 'Pending'}) of the cluster "
                              "is unfinished; the real run would not start until it completes")
    async with Twin(live, _contract(live), time_scale=TIME_SCALE, timings=simulated_delays()) as twin:
        recording = await Player(twin, op, budget=budget).play(timing())
    timed, total = predict(recording.events, durations)
    return Report(live, op, durations, recording, timed, total)
