"""The client layer (ichord.kube, informer, elector) against an API server: the simulator always, and a
real K3s API server through testcontainers when a Docker engine exists (opt-in tier, marker docker)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord import yamlio
from ichord.kube import errors
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import GROUP, VERSION, CustomObjects, Kind, machines
from ichord.kube.leases import LeaseRecord, create_lease, get_lease, update_lease
from ichord.kube.reads import read_secret
from ichord.kube.status import update_status
from ichord.leader import LeaderElector
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from ichord.watchers import Informer, Resource
from tests.integration._kube_helpers import machine

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"
FAST = Timing().scaled(0.02)


def docker_available() -> str | None:
    """None when a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    return None if done.returncode == 0 else "no Docker engine answers `docker info` (K3s needs one)"


@pytest.fixture(scope="session")
def k3s_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    why = docker_available()
    if why is not None:
        pytest.skip(why)
    from testcontainers.community.k3s import K3SContainer

    with K3SContainer() as k3s:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(k3s.config_yaml())
        yield path


async def install_crds(kube: KubeClient) -> None:
    for path in sorted(DEFAULT_CRD_DIR.glob("*.yaml")):
        crd = yamlio.load(path.read_text())
        with contextlib.suppress(errors.AlreadyExists):
            await kube.raw("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
    with anyio.fail_after(60):
        for path in sorted(DEFAULT_CRD_DIR.glob("*.yaml")):
            name = yamlio.load(path.read_text())["metadata"]["name"]
            while True:
                crd = await kube.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (crd.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    break
                await anyio.sleep(0.2)


@pytest.fixture(params=["sim", pytest.param("k3s", marks=pytest.mark.docker)])
async def kube(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KubeClient]:
    if request.param == "sim":
        async with KubeSimulator() as sim:
            client = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), timing=FAST)
            yield client
            await client.close()
        return
    client = await from_kubeconfig(request.getfixturevalue("k3s_kubeconfig"), timing=Timing())
    await install_crds(client)
    for name in ("m", "w"):
        with contextlib.suppress(errors.NotFound):
            await machines(client).delete(NS, name)
    yield client
    await client.close()


class RacedObjects(CustomObjects):
    """Another writer changes the status between the helper's read and its patch, once."""

    raced = False

    async def patch_status(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        if not self.raced:
            self.raced = True
            await super().patch_status(namespace, name, {"status": {"nodeName": "n1"}})
        return await super().patch_status(namespace, name, patch)


async def test_status_helper_retries_a_conflict_on_a_fresh_read(kube: KubeClient) -> None:
    await machines(kube).create(NS, machine("m"))
    seen: list[dict[str, Any]] = []

    def mutate(status: dict[str, Any], _obj: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(status))
        return {**status, "configHash": "abc"}
    raced = RacedObjects(kube, Kind.TALOS_MACHINE)
    out = await update_status(raced, NS, "m", mutate)
    assert out["status"] == {"nodeName": "n1", "configHash": "abc"}  # the racing write is kept
    assert seen == [{}, {"nodeName": "n1"}]  # the second pass ran on a fresh read
    assert await update_status(raced, NS, "m", lambda s, _o: dict(s)) == out  # no change, no write


async def test_typed_errors_from_a_real_api(kube: KubeClient) -> None:
    ms = machines(kube)
    created = await ms.create(NS, machine("w"))
    with pytest.raises(errors.AlreadyExists):
        await ms.create(NS, machine("w"))
    stale = dict(created)
    await ms.patch(NS, "w", {"spec": {"approved": True}})
    with pytest.raises(errors.Conflict):
        await ms.replace(NS, "w", stale)
    with pytest.raises(errors.Invalid) as invalid:
        await ms.patch(NS, "w", {"spec": {"role": "x"}})
    assert invalid.value.status == 422 and any(c.get("field") == "spec.role" for c in invalid.value.causes)
    with pytest.raises(errors.NotFound):
        await ms.get(NS, "nope")
    await ms.delete(NS, "w")


async def test_leases_and_uncached_secret_reads(kube: KubeClient) -> None:
    assert await get_lease(kube, NS, "lock-test") is None
    rec = await create_lease(kube, NS, "lock-test", LeaseRecord("op-uid", 300))
    with pytest.raises(errors.AlreadyExists):
        await create_lease(kube, NS, "lock-test", LeaseRecord("other", 300))
    renewed = await update_lease(kube, NS, "lock-test", rec.with_(transitions=1))
    assert renewed.transitions == 1 and renewed.holder == "op-uid"
    with pytest.raises(errors.Conflict):
        await update_lease(kube, NS, "lock-test", rec.with_(holder="thief"))
    await kube.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lock-test")
    await kube.core().create_namespaced_secret(NS, {"metadata": {"name": "bundle-test"},
                                                    "stringData": {"secrets.yaml": "x"}, "data": {"k": "eA=="}})
    secret = await read_secret(kube, NS, "bundle-test")
    assert secret.data["k"] == b"x" and "eA" not in repr(secret)
    await kube.core().delete_namespaced_secret("bundle-test", NS)


async def test_informer_and_elector(kube: KubeClient) -> None:
    inf = Informer(kube, Resource(GROUP, VERSION, "talosmachines", NS), timing=FAST)
    elector = LeaderElector(kube, namespace=NS, name="ichord-leader-test", timing=FAST)
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        tg.start_soon(elector.run, anyio.sleep_forever)
        with anyio.fail_after(30):
            await inf.wait_synced()
            await machines(kube).create(NS, machine("m"))
            while inf.get(NS, "m") is None or not elector.is_leader:  # noqa: ASYNC110  (polling the API is the point)
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    lease = await get_lease(kube, NS, "ichord-leader-test")
    assert lease is not None and lease.holder is None  # released on the voluntary stop


async def test_status_helper_with_a_cached_copy_skips_the_read_and_survives_a_stale_one(kube: KubeClient) -> None:
    ms = machines(kube)
    created = await ms.create(NS, machine("c"))
    reads = 0

    class Counting(CustomObjects):
        async def get(self, namespace: str, name: str) -> dict[str, Any]:
            nonlocal reads
            reads += 1
            return await super().get(namespace, name)

    counting = Counting(kube, Kind.TALOS_MACHINE)
    out = await update_status(counting, NS, "c", lambda s, _o: {**s, "configHash": "one"}, current=created)
    assert reads == 0 and out["status"]["configHash"] == "one"
    # `created` is now stale: the write is refused (409), re-read and applied; nothing is lost
    out = await update_status(counting, NS, "c", lambda s, _o: {**s, "nodeName": "n"}, current=created)
    assert reads == 1 and out["status"] == {"configHash": "one", "nodeName": "n"}
    # "no change" against a stale copy is not trusted: the fresh read shows there is one to make
    out = await update_status(counting, NS, "c", lambda s, _o: {k: v for k, v in s.items() if k != "nodeName"},
                              current=created)
    assert reads == 2 and out["status"] == {"configHash": "one"}


async def test_a_status_write_sends_only_what_changed_and_the_object_ends_as_the_mutation_made_it(
        kube: KubeClient) -> None:
    """kube/status.py: the patch (applied only to the object as read) is the difference; the status read back is
    exactly the mutation's, nested removals and emptied objects included (a whole-status merge patch kept a nested
    key the mutation dropped)."""
    sent: list[dict[str, Any]] = []

    class Recording(CustomObjects):
        async def patch_status(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
            sent.append(patch["status"])
            return await super().patch_status(namespace, name, patch)

    ops = Recording(kube, Kind.TALOS_OPERATION)
    await ops.create(NS, {"metadata": {"name": "diff"}, "spec": {"clusterRef": {"name": "c1"}, "kind": "config"}})
    plan = {"machines": [{"name": f"w{i}", "change": "Reboot"} for i in range(50)]}
    rolls = {"w1": {"done": [], "startedAt": "t1"}, "w2": {"done": ["x"], "startedAt": "t2"}}
    big = {"plan": plan, "workerRolls": rolls, "stage": "A"}
    steps: list[dict[str, Any]] = [
        big,
        {**big, "workerRolls": {**rolls, "w3": {"done": [], "startedAt": "t3"}}},  # one key added deep
        {**big, "workerRolls": {"w2": {"done": ["x", "y"]}}},  # w1 gone, w2's startedAt gone, a list replaced
        {"plan": plan, "workerRolls": {}, "stage": "B"},  # an object emptied, a scalar changed
        {"plan": plan, "stage": "B", "message": None},  # a top-level key removed; a None written is no key at all
    ]
    for i, want in enumerate(steps):
        out = await update_status(ops, NS, "diff", lambda _s, _o, w=want: json.loads(json.dumps(w)))
        expected = {k: v for k, v in want.items() if v is not None}
        assert (out.get("status") or {}) == expected, i
        assert ((await ops.get(NS, "diff")).get("status") or {}) == expected, i
    assert "plan" in sent[0] and all("plan" not in s for s in sent[1:])  # the unchanged plan is never sent again
    assert sent[1] == {"workerRolls": {"w3": {"done": [], "startedAt": "t3"}}}
    assert sent[2] == {"workerRolls": {"w1": None, "w2": {"done": ["x", "y"], "startedAt": None}, "w3": None}}
    assert sent[3] == {"workerRolls": {"w2": None}, "stage": "B"}
    assert sent[4] == {"workerRolls": None}
