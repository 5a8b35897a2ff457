"""The TalosCluster's spec.maintenance.windows (docs/decisions.md#maintenance-windows) on the real kube-apiserver:
what the schema refuses (a window neither recurring nor one-off, or both; a schedule not of five fields; a duration
not of the form; the simulator refuses the same shapes, tests/unit/test_kube_crds.py), what it lets through for
ichord to refuse with the field named (tests/unit/test_windows.py), and what `kubectl explain` shows."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.kube import errors
from ichord.kube.client import KubeClient
from ichord.kube.crds import clusters
from ichord.operations.windows import Windows, WindowSpecError
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]
NS = "default"
WEEKLY = {"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Europe/Berlin"}


def _cluster(name: str, windows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"secretsRef": {"name": "bundle"}, "endpoint": "https://10.5.0.2:6443",
                                                 "kubernetesVersion": "1.34.1", "maintenance": {"windows": windows}}}


@pytest.mark.parametrize(("window", "says"), [
    ({"name": "w", "schedule": "0 22 * * SAT"}, "oneOf"),  # no duration
    ({"name": "w", "start": "2026-12-24T20:00:00Z"}, "oneOf"),  # no end
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4h", "start": "2026-12-24T20:00:00Z",
      "end": "2026-12-24T23:00:00Z"}, "oneOf"),  # both
    ({"name": "w", "schedule": "0 22 * *", "duration": "4h"}, "should match"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4 hours"}, "should match"),
    ({"schedule": "0 22 * * SAT", "duration": "4h"}, "Required value"),
    ({"name": "w", "start": "christmas", "end": "2026-12-24T23:00:00Z"}, "date-time"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "9999d"}, "lasts at most 7 days"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "7d1s"}, "lasts at most 7 days"),
    ({"name": "w", "start": "2026-12-24T20:00:00Z", "end": "2026-12-31T20:00:01Z"},
     "a one-off maintenance window lasts at most 7 days"),
    ({"name": "w", "start": "2026-12-24T20:00:00+01:00", "end": "2099-12-24T23:00:00Z"},
     "a one-off maintenance window lasts at most 7 days"),
    # A second window of the first's name (a list-type map keyed by name).
    ({"name": "weekly", "start": "2026-12-24T20:00:00Z", "end": "2026-12-24T23:00:00Z"},
     'spec.maintenance.windows[1]: Duplicate value: {"name":"weekly"}'),
])
async def test_what_the_schema_refuses(kube: KubeClient, window: dict[str, Any], says: str) -> None:
    with pytest.raises(errors.Invalid) as refused:
        await clusters(kube).create(NS, _cluster("windows-bad", [WEEKLY, window]))
    assert says in str(refused.value), str(refused.value)
    with pytest.raises(errors.NotFound):
        await clusters(kube).get(NS, "windows-bad")


async def test_a_second_window_of_one_name_is_refused_by_a_patch_too(kube: KubeClient) -> None:
    await clusters(kube).create(NS, _cluster("windows-dup", [WEEKLY]))
    try:
        with pytest.raises(errors.Invalid, match=r'windows\[1\]: Duplicate value: \{"name":"weekly"\}'):
            await clusters(kube).patch(NS, "windows-dup", {"spec": {"maintenance": {"windows": [WEEKLY, {
                **WEEKLY, "schedule": "0 1 * * SUN"}]}}})
        assert (await clusters(kube).get(NS, "windows-dup"))["spec"]["maintenance"]["windows"] == [WEEKLY]
    finally:
        await clusters(kube).delete(NS, "windows-dup")


async def test_a_snapshot_retention_above_a_thousand_is_refused(kube: KubeClient) -> None:
    body = _cluster("retain-bad", [])
    body["spec"]["etcdSnapshots"] = {"path": "/var/lib/ichord/snapshots", "retain": 99999999999}
    with pytest.raises(errors.Invalid, match="retain in body should be less than or equal to 1000"):
        await clusters(kube).create(NS, body)
    with pytest.raises(errors.NotFound):
        await clusters(kube).get(NS, "retain-bad")


@pytest.mark.parametrize("window", [
    {"name": "w", "schedule": "61 22 * * SAT", "duration": "4h"},
    {"name": "w", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Europe/Berlim"},
])
async def test_what_the_schema_lets_through_ichord_refuses_naming_the_field(kube: KubeClient,
                                                                            window: dict[str, Any]) -> None:
    made = await clusters(kube).create(NS, _cluster("windows-late", [WEEKLY, window]))
    try:
        with pytest.raises(WindowSpecError, match=r"spec\.maintenance\.windows\[1\]"):
            Windows.from_cluster_spec(made["spec"])
    finally:
        await clusters(kube).delete(NS, "windows-late")


async def test_a_weekly_and_a_one_off_window_are_accepted_as_written(kube: KubeClient) -> None:
    one_off = {"name": "christmas", "start": "2026-12-24T20:00:00Z", "end": "2026-12-24T23:00:00Z"}
    made = await clusters(kube).create(NS, _cluster("windows-ok", [WEEKLY, one_off]))
    try:
        assert made["spec"]["maintenance"]["windows"] == [WEEKLY, one_off]
        assert Windows.from_cluster_spec(made["spec"]) is not None
    finally:
        await clusters(kube).delete(NS, "windows-ok")


def test_explain_shows_the_windows(control_plane: ControlPlane, crds: list[str]) -> None:
    kc = control_plane.admin_kubeconfig
    explain = run_kubectl(kc, "explain", "taloscluster.spec.maintenance.windows")
    for text in ("schedule", "duration", "timeZone", "start", "end", "WaitingForWindow", "one-off"):
        assert text in explain, explain
    explain = run_kubectl(kc, "explain", "taloscluster.spec.maintenance.windows.schedule")
    assert "0 22 * * SAT" in explain and "daylight" in explain, explain
