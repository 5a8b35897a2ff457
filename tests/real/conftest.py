"""The real tier: one etcd + kube-apiserver per pytest session (tests/real/controlplane.py), the
chart's CRDs applied once, a ``kube`` client bound to it and kubectl against it.

Every test here is marked ``real`` and skips, saying why, only when the binaries scripts/tools.sh
builds are absent. A failing test gets the tail of both logs in its report; the run directory (logs,
kubeconfigs) stays under pytest's basetemp.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from tests.real import tools
from tests.real.controlplane import ControlPlane

_PLANE: list[ControlPlane] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _PLANE and "real" in item.keywords:
        report.sections.append(("real control plane logs", _PLANE[0].log_tails()))
    return report


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    reason = tools.missing("etcd", "kube-apiserver", "kubectl")
    if reason:
        pytest.skip(reason)
    plane = ControlPlane.from_tools(tmp_path_factory.mktemp("real-control-plane"))
    _PLANE.append(plane)
    try:
        plane.start()
        # What kube-controller-manager would do: the default ServiceAccount that pod admission looks up.
        plane.ensure("/api/v1/namespaces/default/serviceaccounts",
                     {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        yield plane
    finally:
        plane.stop()


def run_kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """kubectl's stdout and stderr; an AssertionError with both when ``check`` and it fails."""
    binary = tools.kubectl()
    assert binary is not None
    result = subprocess.run([binary, "--kubeconfig", str(kubeconfig), *args], input=stdin,
                            capture_output=True, text=True, check=False, timeout=60)
    out = result.stdout + result.stderr
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {out}")
    return out


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> list[str]:
    """The chart's CRDs (found where the simulator loads them from), applied and Established."""
    out = run_kubectl(control_plane.admin_kubeconfig, "apply", "-f", str(DEFAULT_CRD_DIR))
    names = [line.split()[0].split("/", 1)[1] for line in out.splitlines() if line.startswith("customresource")]
    run_kubectl(control_plane.admin_kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
                *(f"crd/{n}" for n in names))
    return names


@pytest.fixture
async def kube(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[KubeClient]:
    """ichord's own client, as the admin, on the real API server (namespace default)."""
    client = await from_kubeconfig(control_plane.admin_kubeconfig)
    yield client
    await client.close()
