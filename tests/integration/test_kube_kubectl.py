"""kubectl against the simulator: apply the chart's CRDs and objects, get with printer columns, get -w,
get events (sorted), the API server's 422 for a bad object, and the imperative ``kubectl create``
commands that send protobuf. Runs with every distinct kubectl there is (the one scripts/tools.sh
builds, the machine's); skips when there is none."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from ichord.api.conditions import set_operation_phase
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from tests.real import tools


def _kubectls() -> list[str]:
    found = [str(p) for p in (tools.tool("kubectl"), shutil.which("kubectl")) if p is not None]
    return list(dict.fromkeys(str(Path(p).resolve()) for p in found)) or ["missing"]


KUBECTLS = _kubectls()
pytestmark = [pytest.mark.anyio, pytest.mark.integration,
              pytest.mark.skipif(KUBECTLS == ["missing"], reason="kubectl is not installed and not built "
                                 "(scripts/tools.sh)")]

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

NEWER_EVENT = EVENT.replace("cp1.1", "cp1.0").replace("ConfigApplied", "RebootRequired").replace(
    "configuration applied", "reboot needed").replace("00:00:00Z", "00:05:00Z")


@pytest.fixture(params=KUBECTLS)
def kubectl_binary(request: pytest.FixtureRequest) -> str:
    binary: str = request.param
    return binary


@pytest.fixture
async def kubeconfig(tmp_path: Path, kubectl_binary: str) -> AsyncIterator[tuple[KubeSimulator, Path]]:
    # The cluster starts without ichord's CRDs: kubectl installs them from the chart.
    async with KubeSimulator(SimSettings(crd_dir=None)) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kubeconfig")
        _BINARY[kc] = kubectl_binary
        yield sim, kc
        _BINARY.pop(kc, None)


#: The kubectl each test's kubeconfig is driven with (the parametrised binary).
_BINARY: dict[Path, str] = {}


async def kubectl(kc: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    result = await anyio.run_process([_BINARY[kc], "--kubeconfig", str(kc), *args],
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
    assert ops[0].split() == ["NAME", "CLUSTER", "KIND", "PHASE", "STAGE", "STEP", "PROGRESS", "ETA",
                              "AGE"] and "ca-rotation" in ops[1]
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

    async with await anyio.open_process([_BINARY[kc], "--kubeconfig", str(kc), "get", "talosmachines",
                                         "-w"]) as proc:
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

    await kubectl(kc, "create", "-f", "-", stdin=NEWER_EVENT)
    await kubectl(kc, "create", "-f", "-", stdin=EVENT)
    events = await kubectl(kc, "get", "events")
    assert "ConfigApplied" in events and "configuration applied" in events
    # --sort-by asks the Table for whole objects (includeObject=Object) and sorts on them: oldest first.
    rows = (await kubectl(kc, "get", "events", "--sort-by=.lastTimestamp", "-o", "name")).split()
    assert rows == ["event/cp1.1", "event/cp1.0"]
    rows = (await kubectl(kc, "get", "events", "--sort-by=.lastTimestamp")).splitlines()
    # As the real server prints events: no NAME column (it is last, in -o wide), OBJECT is kind/name.
    assert rows[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert [r.split()[2:4] for r in rows[1:]] == [["ConfigApplied", "talosmachine/cp1"],
                                                  ["RebootRequired", "talosmachine/cp1"]]


async def test_kubectl_create_sends_protobuf(kubeconfig: tuple[KubeSimulator, Path]) -> None:
    """kubectl's imperative create sends built-in kinds as protobuf; the simulator takes them as a real
    server does, and names the kinds it cannot decode instead of storing half an object."""
    sim, kc = kubeconfig
    assert "namespace/ops created" in await kubectl(kc, "create", "namespace", "ops")
    await kubectl(kc, "create", "secret", "generic", "bundle", "-n", "ops", "--from-literal=a=b",
                  "--from-literal=c=d")
    await kubectl(kc, "create", "configmap", "settings", "-n", "ops", "--from-literal=k=v")
    await kubectl(kc, "create", "serviceaccount", "robot", "-n", "ops")
    secret = json.loads(await kubectl(kc, "get", "secret", "bundle", "-n", "ops", "-o", "json"))
    assert secret["data"] == {"a": "Yg==", "c": "ZA=="} and secret["type"] == "Opaque"
    cm = json.loads(await kubectl(kc, "get", "configmap", "settings", "-n", "ops", "-o", "json"))
    assert cm["data"] == {"k": "v"} and cm["metadata"]["namespace"] == "ops"
    ns = json.loads(await kubectl(kc, "get", "namespace", "ops", "-o", "json"))
    assert ns["status"] == {"phase": "Active"} and ns["metadata"]["uid"]
    assert "robot" in await kubectl(kc, "get", "serviceaccounts", "-n", "ops")
    typed = await kubectl(kc, "create", "secret", "generic", "typed", "-n", "ops", "--type=example.com/x",
                          "--from-literal=x=y", "--save-config")
    assert "secret/typed created" in typed
    got = sim.store.get(sim.store.resolve("", "v1", "secrets"), "ops", "typed")
    assert got["type"] == "example.com/x"
    assert json.loads(got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])[
        "type"] == "example.com/x"
    refused = await kubectl(kc, "create", "deployment", "web", "-n", "ops", "--image=nginx", check=False)
    assert "cannot decode this protobuf body (kind apps/v1/Deployment)" in refused
    assert 'namespace "ops" deleted' in await kubectl(kc, "delete", "namespace", "ops")


async def _status(kc: Path, name: str, phase: str) -> None:
    """Write the operation's phase the way the daemon does (with its Succeeded condition), through kubectl."""
    status: dict[str, object] = {}
    set_operation_phase(status, phase, f"phase {phase}")
    await kubectl(kc, "patch", "talosoperation", name, "--subresource", "status", "--type", "merge", "-p",
                  json.dumps({"status": status}))


async def test_kubectl_wait_ends_on_the_succeeded_condition(kubeconfig: tuple[KubeSimulator, Path]) -> None:
    """Issue 14: `kubectl wait --for=condition=Succeeded` ends on success, `=false` on failure; running is Unknown."""
    _sim, kc = kubeconfig
    await kubectl(kc, "apply", "-f", str(DEFAULT_CRD_DIR))
    second = OBJECTS.split("---")[2].replace("name: rot}", "name: rot2}")
    await kubectl(kc, "apply", "-f", "-", stdin=OBJECTS + "---\n" + second)
    for name, final, wanted in (("rot", "Completed", "Succeeded"), ("rot2", "Failed", "Succeeded=false")):
        await _status(kc, name, "InProgress")
        running = await kubectl(kc, "wait", f"talosoperation/{name}", f"--for=condition={wanted}", "--timeout=1s",
                                check=False)
        assert "timed out" in running  # Unknown while it runs: neither waits ends
        async with await anyio.open_process([_BINARY[kc], "--kubeconfig", str(kc), "wait", f"talosoperation/{name}",
                                             f"--for=condition={wanted}", "--timeout=30s"]) as proc:
            await anyio.sleep(0.3)
            assert proc.returncode is None  # still waiting
            await _status(kc, name, final)
            with anyio.fail_after(30):
                await proc.wait()
            assert proc.returncode == 0
            assert proc.stdout is not None
            assert "condition met" in (await proc.stdout.receive()).decode()


async def test_kubectl_shows_the_servers_warning_for_an_unknown_field(kubeconfig: tuple[KubeSimulator, Path]) -> None:
    """kubectl patch sends no fieldValidation: the server's default (Warn) drops an unknown field and says so in a
    Warning header, which kubectl prints (the same on the real server: tests/real/test_sim_differential.py)."""
    _sim, kc = kubeconfig
    await kubectl(kc, "apply", "-f", str(DEFAULT_CRD_DIR))
    await kubectl(kc, "apply", "-f", "-", stdin=OBJECTS.split("---", maxsplit=1)[0])
    out = await kubectl(kc, "patch", "taloscluster", "c1", "--type", "merge", "-p", '{"spec":{"x":1}}')
    assert 'Warning: unknown field "spec.x"' in out, out
    assert "x" not in json.loads(await kubectl(kc, "get", "taloscluster", "c1", "-o", "json"))["spec"]
    out = await kubectl(kc, "patch", "taloscluster", "c1", "--type", "json",
                        "-p", '[{"op":"add","path":"/spec/maintenance","value":{"windows":[],"y":2}}]')
    assert 'Warning: unknown field "spec.maintenance.y"' in out, out
