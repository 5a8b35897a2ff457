"""docs/decisions.md#config-rollout's never-reboot table, row by row, on the Talos node simulator (issue 13).

Each row builds a machine (role, its own patch) and a cluster change (a cluster patch), runs
``reconcile_machine`` once against the simulated node over mutual TLS, and checks the Ready reason, what
is reported, and, from the node's own history, whether anything was applied. The reconciler never reboots
and never restarts kube-apiserver on a control plane: those differences are reported, a config operation
rolls them out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest

from ichord.api.disruptions import Disruption, PlannedDisruption
from ichord.api.views import MachineView, OperationView
from ichord.machines.reconciler import reconcile_machine
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SAFE = "machine:\n  sysctls:\n    net.core.somaxconn: \"65535\"\n"
REBOOT = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"
API_SERVER = "apiVersion: v1alpha1\nkind: KubeNetworkConfig\ndnsDomain: table.example\n"
# What Talos's decoder refuses (issue 26): a wrong type (once classed RebootRequired and rolled out with reboots)
# and an unknown field (once in no diff at all).
WRONG_TYPE = "machine:\n  env: just-a-string\n"
UNKNOWN_FIELD = "machine:\n  nonsense: 1\n"


@dataclass(frozen=True)
class Row:
    """A builder's product: who the machine is and what changed (cert-manager's ``certificate(name, *mods)``)."""

    role: str = "worker"
    cluster_patches: tuple[str, ...] = ()
    machine_patches: tuple[str, ...] = ()
    held_by: OperationView | None = None
    unreachable: bool = False


def row(*mods: Any) -> Row:
    r = Row()
    for mod in mods:
        r = mod(r)
    return r


def control_plane(r: Row) -> Row:
    return replace(r, role="controlplane")


def patched(*patches: str) -> Any:
    return lambda r: replace(r, cluster_patches=patches)


def machine_patched(*patches: str) -> Any:
    return lambda r: replace(r, machine_patches=patches)


#: A ca-rotation under way (Issuing): its kind holds the machine reconciler off the nodes.
ROTATION = OperationView.of({"metadata": {"namespace": "ns", "name": "rotate", "uid": "rot-uid"},
                             "spec": {"kind": "ca-rotation", "clusterRef": {"name": "demo"}},
                             "status": {"phase": "InProgress", "caRotation": {"stage": "Issuing"}}})


def rotating(r: Row) -> Row:
    return replace(r, held_by=ROTATION)


def unreachable(r: Row) -> Row:
    return replace(r, unreachable=True)


# (row, Ready status, reason, applied, rebootPaths non-empty, apiServerRestartPaths non-empty)
TABLE = {
    "converged worker": (row(), "True", "Converged", False, False, False),
    "converged control plane": (row(control_plane), "True", "Converged", False, False, False),
    "safe change on a worker: applied": (row(patched(SAFE)), "True", "Applied", True, False, False),
    "safe change on a control plane: applied": (row(control_plane, patched(SAFE)), "True", "Applied", True, False,
                                                False),
    "reboot change on a worker: reported": (row(patched(REBOOT)), "False", "RebootRequired", False, True, False),
    "reboot change on a control plane: reported": (row(control_plane, patched(REBOOT)), "False", "RebootRequired",
                                                   False, True, False),
    "API-server change on a control plane: reported": (row(control_plane, patched(API_SERVER)), "False",
                                                       "APIServerRestartRequired", False, False, True),
    "API-server change on a worker: applied as safe": (row(patched(API_SERVER)), "True", "Applied", True, False,
                                                       False),
    "reboot and safe together: nothing applied": (row(patched(SAFE, REBOOT)), "False", "RebootRequired", False, True,
                                                  False),
    "a rotation under way: stands aside": (row(patched(SAFE), rotating), "Unknown", "CARotationInProgress", False,
                                           False, False),
    "unreachable: reported, retried": (row(patched(SAFE), unreachable), "False", "Unreachable", False, False, False),
    "wrong type in a cluster patch: refused, nothing applied": (row(patched(SAFE, WRONG_TYPE)), "False",
                                                                "InvalidConfig", False, False, False),
    "unknown field in a cluster patch on a control plane: refused": (row(control_plane, patched(UNKNOWN_FIELD)),
                                                                     "False", "InvalidConfig", False, False, False),
    "wrong type in a machine patch: refused": (row(control_plane, machine_patched(WRONG_TYPE)), "False",
                                               "InvalidConfig", False, False, False),
    "unknown field in a machine patch: refused": (row(machine_patched(SAFE, UNKNOWN_FIELD)), "False",
                                                  "InvalidConfig", False, False, False),
}


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=1) as e:
        yield e


@pytest.mark.parametrize("case", list(TABLE))
async def test_never_reboot_table(env: SimEnvironment, bundle: SecretsBundle, case: str) -> None:
    r, status, reason, applied, reboot_paths, api_paths = TABLE[case]
    name = next(m.name for m in env.machines if m.role == r.role)
    spec = {"clusterRef": {"name": env.cluster_name}, "role": r.role, "address": env.endpoints[name],
            "approved": True, "patches": list(r.machine_patches)}
    machine = MachineView.of({"metadata": {"namespace": env.namespace, "name": name}, "spec": spec})
    cluster = replace(env.cluster_inputs(), patches=r.cluster_patches)
    applies_before = len(env.applies(name))
    boots_before = env.node(name).boots
    if r.unreachable:
        await env.set_unreachable(name)
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=1, rpc_timeout=5) as talos:
        result = await reconcile_machine(talos, bundle, cluster, machine, held_by=r.held_by,
                                         retry_after=30.0, resync_after=300.0)
    assert (result.ready.status, result.ready.reason) == (status, reason), result.ready.message
    assert result.applied is applied
    assert (len(env.applies(name)) > applies_before) is applied  # from the node's history, not ichord's word
    assert bool(result.fields.get("rebootPaths")) is reboot_paths
    assert bool(result.fields.get("apiServerRestartPaths")) is api_paths
    assert env.node(name).boots == boots_before  # never a reboot, whatever the row
    if r.unreachable:
        assert result.requeue_after == 30.0
    if r.held_by is not None:  # the holding operation named by its kind's title and namespace/name
        assert result.ready.message.startswith("a CA rotation (TalosOperation ns/rotate) is under way"), \
            result.ready.message
    if reason == "InvalidConfig":
        # One Warning naming the field and what Talos expects; no stale reboot paths for a config operation to plan.
        assert result.event is not None and result.event[:2] == ("Warning", "InvalidConfig")
        assert "machine.env: expected a mapping" in result.ready.message or \
            "machine.nonsense: unknown field" in result.ready.message, result.ready.message
        assert result.fields.get("rebootPaths") == []


async def test_a_memo_spares_the_unchanged_and_never_hides_a_change(
        env: SimEnvironment, bundle: SecretsBundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept per machine by the cluster actor: a converged machine is checked without render or parse, and a
    changed spec (the cluster's patch) or a node changed behind ichord's back (drift) is still seen."""
    from ichord.machines import reconciler
    from ichord.machines.memo import ConfigMemo
    from ichord.render.config import MachineConfig
    from ichord.render.inputs import MachineInputs
    from ichord.talos.client import ApplyMode

    calls = {"render": 0, "parse": 0}
    real_render, real_plain_of = reconciler.render, MachineConfig.plain_of

    def counting_render(*args: Any, **kwargs: Any) -> Any:
        calls["render"] += 1
        return real_render(*args, **kwargs)

    def counting_plain_of(data: str | bytes) -> list[Any]:
        calls["parse"] += 1
        return real_plain_of(data)

    monkeypatch.setattr(reconciler, "render", counting_render)
    monkeypatch.setattr(reconciler.MachineConfig, "plain_of", staticmethod(counting_plain_of))
    name = next(m.name for m in env.machines if m.role == "worker")
    spec = {"clusterRef": {"name": env.cluster_name}, "role": "worker", "address": env.endpoints[name],
            "approved": True}
    machine = MachineView.of({"metadata": {"namespace": env.namespace, "name": name}, "spec": spec})
    base = env.cluster_inputs()
    changed = replace(base, patches=(SAFE,))
    memo = ConfigMemo()
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=1, rpc_timeout=5) as talos:
        async def step(cluster: Any) -> tuple[str, int, int]:
            before = dict(calls)
            result = await reconcile_machine(talos, bundle, cluster, machine, held_by=None,
                                             retry_after=30.0, resync_after=300.0, memo=memo)
            return result.ready.reason, calls["render"] - before["render"], calls["parse"] - before["parse"]

        assert await step(base) == ("Converged", 1, 1)
        assert await step(base) == ("Converged", 0, 0)  # nothing changed: nothing derived again
        assert (await step(changed))[0] == "Applied"  # the cluster's spec changed: a miss, rendered, applied
        assert await step(changed) == ("Converged", 0, 1)  # the node's bytes changed (the apply): parsed again
        applies = len(env.applies(name))
        drifted = real_render(bundle, base, MachineInputs.from_spec(spec))
        await talos.apply_configuration(env.endpoints[name], drifted.to_bytes(), ApplyMode.NO_REBOOT,
                                        contract=env.contract)
        # Drift behind ichord's back, same inputs: the node's bytes are the first step's again, so their hash is
        # known (content, not time), and it differs from the render's: rendered again and compared (one parse).
        assert await step(changed) == ("Applied", 1, 1)
        assert len(env.applies(name)) == applies + 2  # the drift, then ichord's own apply (the node's history)
        assert (await step(changed))[0] == "Converged"


async def test_a_machine_waiting_for_its_reboot_is_not_parsed_again_every_step(
        env: SimEnvironment, bundle: SecretsBundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reboot-class difference is only reported until a config rollout reaches the machine, and the cluster's
    every step checks it meanwhile: the same node bytes against the same render are not rendered, parsed and
    diffed again; a change on either side (the render's patch, the node's configuration) is classified afresh."""
    from ichord.machines import reconciler
    from ichord.machines.memo import ConfigMemo
    from ichord.render.config import MachineConfig

    calls = {"render": 0, "parse": 0}
    real_render, real_parse = reconciler.render, MachineConfig.parse

    def counting_render(*args: Any, **kwargs: Any) -> Any:
        calls["render"] += 1
        return real_render(*args, **kwargs)

    def counting_parse(data: str | bytes) -> Any:
        calls["parse"] += 1
        return real_parse(data)

    monkeypatch.setattr(reconciler, "render", counting_render)
    monkeypatch.setattr(reconciler.MachineConfig, "parse", staticmethod(counting_parse))
    name = next(m.name for m in env.machines if m.role == "worker")
    spec = {"clusterRef": {"name": env.cluster_name}, "role": "worker", "address": env.endpoints[name],
            "approved": True}
    machine = MachineView.of({"metadata": {"namespace": env.namespace, "name": name}, "spec": spec})
    waiting = replace(env.cluster_inputs(), patches=(REBOOT,))
    other = replace(env.cluster_inputs(), patches=(REBOOT, "apiVersion: v1alpha1\nkind: KernelModuleConfig\n"
                                                            "name: nf_conntrack\n"))
    memo = ConfigMemo()
    boots, applies = env.node(name).boots, len(env.applies(name))
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=1, rpc_timeout=5) as talos:
        async def step(cluster: Any) -> tuple[str, tuple[str, ...], int]:
            before = dict(calls)
            result = await reconcile_machine(talos, bundle, cluster, machine, held_by=None,
                                             retry_after=30.0, resync_after=300.0, memo=memo)
            return (result.ready.reason, tuple(result.fields.get("rebootPaths") or ()),
                    calls["parse"] - before["parse"])

        first = await step(waiting)
        assert first[0] == "RebootRequired" and first[1] and first[2] == 1
        assert await step(waiting) == (*first[:2], 0)  # the same difference: reported again, nothing parsed
        assert calls["render"] == 2  # the render is hashed once (the memo), then again only for the first diff
        changed = await step(other)  # the render changed: classified afresh, the new document named
        assert changed[0] == "RebootRequired" and changed[2] == 1 and len(changed[1]) > len(first[1])
    assert (env.node(name).boots, len(env.applies(name))) == (boots, applies)  # only reported, never applied


NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def _planned(what: Disruption, seconds_ago: float) -> PlannedDisruption:
    return PlannedDisruption("m", what, "ns/roll", NOW - dt.timedelta(seconds=seconds_ago), bound=1200.0)


# planned disruption, rotation under way, node unreachable -> Ready status, reason, Event type and reason
PLANNED = {
    "a planned reboot: Rebooting, Normal": (_planned(Disruption.REBOOT, 5), False, True,
                                            "False", "Rebooting", "Normal", "MachineRebooting"),
    "a planned reboot during a rotation: Rebooting": (_planned(Disruption.REBOOT, 5), True, True,
                                                       "False", "Rebooting", "Normal", "MachineRebooting"),
    "a planned kube-apiserver restart: APIServerRestarting, Normal": (
        _planned(Disruption.API_SERVER_RESTART, 5), False, False,
        "False", "APIServerRestarting", "Normal", "MachineAPIServerRestarting"),
    "a planned reboot past its bound: Unreachable, Warning": (_planned(Disruption.REBOOT, 1200), False, True,
                                                               "False", "Unreachable", "Warning", "MachineUnreachable"),
    "nothing planned: Unreachable, Warning": (None, False, True,
                                              "False", "Unreachable", "Warning", "MachineUnreachable"),
}


@pytest.mark.parametrize("case", list(PLANNED))
async def test_a_planned_loss_is_no_fault(env: SimEnvironment, bundle: SecretsBundle, case: str) -> None:
    """A loss an operation's markers plan is said as planned and the node is left alone; one nobody planned, or one
    past its bound, is a Warning that names the operation."""
    planned, rotating_, down, status, reason, event_type, event_reason = PLANNED[case]
    name = next(m.name for m in env.machines if m.role == "controlplane")
    spec = {"clusterRef": {"name": env.cluster_name}, "role": "controlplane", "address": env.endpoints[name],
            "approved": True}
    machine = MachineView.of({"metadata": {"namespace": env.namespace, "name": name}, "spec": spec})
    if down:
        await env.set_unreachable(name)
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=1, rpc_timeout=5) as real:
        # Within its bound the node is left to the operation: a client that fails on any use proves no call.
        talos = cast(TalosClient, _NoCalls()) if event_type == "Normal" else real
        result = await reconcile_machine(talos, bundle, env.cluster_inputs(), machine,
                                         held_by=ROTATION if rotating_ else None,
                                         retry_after=30.0, resync_after=300.0, planned=planned, now=NOW)
    assert (result.ready.status, result.ready.reason) == (status, reason), result.ready.message
    assert result.event is not None and result.event[:2] == (event_type, event_reason), result.event
    assert result.requeue_after == 30.0
    if planned is not None:
        assert "ns/roll" in result.ready.message  # the operation is named, by namespace/name


class _NoCalls:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the reconciler used the Talos client ({name}) for a machine under a planned loss")
