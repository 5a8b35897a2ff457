"""kubectl against the simulator: apply the chart's CRDs and objects, get with printer columns, get -w,
get events, and the API server's 422 for a bad object. Skips when kubectl is not installed."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.sim.kube.server import DEFAULT_CRD_DIR

pytestmark = [pytest.mark.anyio, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")]

OBJECTS = """\
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosCluster
metadata: {name: c1}
spec: {secretsRef: {name: bundle}, endpoint: "https://10.5.0.2:6443", kubernetesVersion: "1.34.1"}
---
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosMachine
metadata: {name: cp1}
spec: {clusterRef: {name: c1}, role: controlplane, address: 10.5.0.2}
---
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosOperation
metadata: {name: rot}
spec: {clusterRef: {name: c1}, kind: ca-rotation}
"""

EVENT = """\
apiVersion: v1
kind: Event
metadata: {name: cp1.1}
involvedObject: {kind: TalosMachine, name: cp1, namespace: default}
reason: ConfigApplied
message: configuration applied
type: Normal
lastTimestamp: "2026-01-01T00:00:00Z"
"""


@pytest.fixture
async def kubeconfig(tmp_path: Path) -> AsyncIterator[tuple[KubeSimulator, Path]]:
    # The cluster starts without ichord's CRDs: kubectl installs them from the chart.
    async with KubeSimulator(SimSettings(crd_dir=None)) as sim:
        yield sim, sim.write_kubeconfig(tmp_path / "kubeconfig")


async def kubectl(kc: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    result = await anyio.run_process(["kubectl", "--kubeconfig", str(kc), *args],
                                     input=stdin.encode() if stdin else None, check=False)
    out = result.stdout.decode() + result.stderr.decode()
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {out}")
    return out


async def test_kubectl_apply_get_watch_events(kubeconfig: tuple[KubeSimulator, Path], tmp_path: Path) -> None:
    _sim, kc = kubeconfig
    out = await kubectl(kc, "apply", "-f", str(DEFAULT_CRD_DIR))
    assert out.count("created") == 3
    out = await kubectl(kc, "apply", "-f", "-", stdin=OBJECTS)
    assert "talosmachine.ichor.maesh.dev/cp1 created" in out
    header = (await kubectl(kc, "get", "talosmachines")).splitlines()[0].split()
    assert header == ["NAME", "CLUSTER", "ROLE", "READY", "REASON", "AGE"]
    assert (await kubectl(kc, "get", "talosclusters")).splitlines()[0].split() == [
        "NAME", "READY", "REASON", "EXPIRES", "ENDPOINT", "CONTRACT", "AGE"]
    ops = (await kubectl(kc, "get", "talosoperations")).splitlines()
    assert ops[0].split() == ["NAME", "CLUSTER", "KIND", "PHASE", "STAGE", "STEP", "AGE"] and "ca-rotation" in ops[1]
    bad = await kubectl(kc, "apply", "-f", "-", check=False,
                        stdin=OBJECTS.split("---")[1].replace("controlplane", "leader").replace("cp1", "bad"))
    assert 'spec.role: Unsupported value: "leader"' in bad
    # kubectl's default validation is the server's strict field validation.
    unknown = await kubectl(kc, "apply", "-f", "-", check=False,
                            stdin=OBJECTS.split("---")[1].replace("address:", "bogus: 1, address:"))
    assert 'strict decoding error: unknown field "spec.bogus"' in unknown
    explain = await kubectl(kc, "explain", "talosoperation.spec.kind")
    assert "ca-rotation" in explain and "config" in explain and "immutable" in explain
    # Every field is described, so `kubectl explain` teaches the API.
    explain = await kubectl(kc, "explain", "taloscluster.spec.secretsRef")
    assert "secrets.yaml" in explain and "talosctl gen secrets" in explain
    explain = await kubectl(kc, "explain", "talosoperation.status.caRotation.step")
    assert "Finalizing's sub-step" in explain

    async with await anyio.open_process(["kubectl", "--kubeconfig", str(kc), "get", "talosmachines", "-w"]) as proc:
        assert proc.stdout is not None
        await kubectl(kc, "patch", "talosmachine", "cp1", "--subresource", "status", "--type", "merge", "-p",
                      '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Converged",'
                      '"message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}')
        seen = ""
        with anyio.fail_after(10):
            while "Converged" not in seen:
                seen += (await proc.stdout.receive()).decode()
        proc.terminate()
    assert "True" in seen

    await kubectl(kc, "create", "-f", "-", stdin=EVENT)
    events = await kubectl(kc, "get", "events")
    assert "ConfigApplied" in events and "configuration applied" in events
