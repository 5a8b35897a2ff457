"""Key custody (issue 26) on the simulators: a rotation's new CA keys are never in only one object one delete removes.

From the save until Done they are in the bundle Secret (held by the finalizer ichor.maesh.dev/ca-custody) and in the
custody copy (a Secret owned by the TalosOperation). A bundle Secret deleted mid-rotation is held; one deleted with
its finalizer forced off, emptied of rotation.yaml or replaced by an older secrets.yaml pauses the rotation with
BundleRestoreRequired naming the copy and `ichord cluster restore-bundle`, which `cluster status` suggests; after the
command the rotation completes on the SAME new CAs (read from the simulated nodes). Then every bad input of the
command: exit 2 (or 1) and nothing written.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.cli import main
from ichord.cluster_status import next_step
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.operations.ca_rotation.custody import copy_name
from ichord.operations.outcome import Done
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.status import ApiError
from tests.integration._ca_rotation_driver import Driver, at, secret_data

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
SECRETS = ("", "v1", "secrets")


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    # A separate management API: the CLI's kubeconfig keeps working across the Kubernetes CA's rotation.
    async with SimEnvironment(bundle=bundle, time_scale=0.02, management_api="separate") as e:
        yield e


@pytest.fixture
async def driver(env: SimEnvironment) -> AsyncIterator[Driver]:
    async with await from_kubeconfig(env.kubeconfig) as kube:
        recorder = EventRecorder(kube)
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            d = Driver(env, kube, recorder)
            try:
                yield d
            finally:
                await d.managed.close_all()
            await recorder.drain()
            tg.cancel_scope.cancel()


def _store_secret(env: SimEnvironment, name: str) -> Obj | None:
    store = env.management.store
    try:
        return store.get(store.resolve(*SECRETS), env.namespace, name)
    except ApiError:  # the simulator's NotFound
        return None


async def _cli(env: SimEnvironment, *args: str) -> int:
    argv = ["cluster", *args, "--kubeconfig", str(env.kubeconfig)]
    return int(await anyio.to_thread.run_sync(main, argv))


def _nodes_fingerprints(env: SimEnvironment) -> dict[str, set[str]]:
    """Each CA the nodes sign with (their own view, short fingerprints), per CA name."""
    out: dict[str, set[str]] = {}
    for m in env.machine_names:
        for name, view in env.node(m).state()["cas"].items():
            if view.get("issuing"):
                out.setdefault(name, set()).add(view["issuing"])
    return out


def _restore_condition(op: Obj) -> Obj | None:
    cond = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION)
    return cond if cond is not None and cond["reason"] == "BundleRestoreRequired" else None


async def _until_restore_required(driver: Driver) -> Obj:
    for _ in range(20):
        await driver.step()
        op = await driver.get()
        if _restore_condition(op):
            return op
    raise AssertionError((await driver.get())["status"])


async def test_the_keys_are_in_two_objects_from_the_save_until_done(env: SimEnvironment, driver: Driver) -> None:
    env.management.requests.clear()
    await driver.create()
    await driver.run(until=at("Accepting"))
    op = await driver.get()
    kept = _store_secret(env, copy_name(op["metadata"]["uid"]))
    assert kept is not None and kept["type"] == names.CUSTODY_SECRET_TYPE
    assert kept["metadata"]["ownerReferences"][0]["uid"] == op["metadata"]["uid"]
    assert kept["metadata"]["labels"][names.CUSTODY_OF_LABEL] == "rotate"
    data = secret_data(env)
    assert base64.b64decode(kept["data"][names.ROTATION_KEY]) == data[names.ROTATION_KEY]
    assert base64.b64decode(kept["data"][names.SECRETS_KEY]) == data[names.SECRETS_KEY]
    bundle_secret = _store_secret(env, env.secret_name)
    assert bundle_secret is not None and names.BUNDLE_CUSTODY_FINALIZER in bundle_secret["metadata"]["finalizers"]
    # Held: a plain delete leaves the Secret (and its keys) in place.
    assert isinstance(await driver.run(), Done)
    assert _store_secret(env, copy_name(op["metadata"]["uid"])) is None  # cleaned with the operation
    assert not (_store_secret(env, env.secret_name) or {})["metadata"].get("finalizers")
    assert set(secret_data(env)) == {names.SECRETS_KEY}
    # What custody costs a whole rotation on the management API: the copy created once and deleted once, one
    # update more of the bundle Secret (the finalizer off at Done; rotation.yaml and the finalizer go in one).
    log = env.management.requests
    assert (log.count("create", resource="secrets"), log.count("delete", resource="secrets")) == (1, 1)
    assert log.count("update", resource="secrets") == 3  # the save, the replacement, the finalizer off


#: How the bundle Secret loses the keys, and what restore-bundle then does.
LOSSES = [("deleted", "Issuing", "recreated"), ("forced", "Accepting", "created"), ("forced", "Dropping", "created"),
          ("older", "Issuing", "updated"), ("forced", "Finalizing", "created"),
          ("other-rotation", "Accepting", "updated"), ("deleted", "AwaitingCredentials", "recreated")]


@pytest.mark.parametrize(("how", "stage", "action"), LOSSES, ids=[f"{h}-{s}" for h, s, _ in LOSSES])
async def test_a_lost_bundle_secret_is_restored_by_the_named_command_and_the_rotation_completes_on_the_same_cas(
        env: SimEnvironment, driver: Driver, how: str, stage: str, action: str,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = secret_data(env)[names.SECRETS_KEY]
    await driver.create()
    await driver.run(until=at(stage))
    op = await driver.get()
    nexts = {c["name"]: c["next"] for c in op["status"]["caRotation"]["certificates"]}
    path = f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}"
    if how == "deleted":
        await driver.kube.raw("DELETE", path)
        held = _store_secret(env, env.secret_name)
        assert held is not None and held["metadata"].get("deletionTimestamp")  # held by the custody finalizer
        assert names.ROTATION_KEY in secret_data(env)
    elif how == "forced":
        await driver.kube.raw("PATCH", path, body={"metadata": {"finalizers": None}},
                              content_type="application/merge-patch+json")
        await driver.kube.raw("DELETE", path)
        assert _store_secret(env, env.secret_name) is None
    elif how == "older":  # replaced by the secrets.yaml the cluster had before the rotation, without rotation.yaml
        current = await driver.kube.raw("GET", path)
        current["data"] = {names.SECRETS_KEY: base64.b64encode(old).decode()}
        await driver.kube.raw("PUT", path, body=current)
    else:  # another rotation.yaml (new keys nobody gave the nodes) in its place
        from ichord.pki.rotation import Target, generate_rotation

        current = await driver.kube.raw("GET", path)
        other = generate_rotation((Target.TALOS, Target.KUBERNETES)).to_yaml().encode()
        current["data"][names.ROTATION_KEY] = base64.b64encode(other).decode()
        await driver.kube.raw("PUT", path, body=current)

    op = await _until_restore_required(driver)
    cond = _restore_condition(op)
    assert cond is not None and op["status"]["phase"] == "Paused"
    command = f"ichord cluster restore-bundle {env.cluster_name} -n {env.namespace}"
    assert command in cond["message"] and copy_name(op["metadata"]["uid"]) in cond["message"]
    assert "create it with" not in cond["message"]  # the advice that lost the keys before
    assert next_step(op, env.cluster_name, env.namespace) == command  # what `cluster status` suggests
    if stage == "AwaitingCredentials":  # the hand-off names the restore instead of failing on the lost Secret
        capsys.readouterr()
        (tmp_path / "creds").mkdir()  # a directory the user names must exist (docs/decisions.md#cli-files)
        assert await _cli(env, "credentials", env.cluster_name, "-n", env.namespace, "--acknowledge",
                          "-d", str(tmp_path / "creds"), "--wait", "5") == 2
        assert command in capsys.readouterr().err
        assert list((tmp_path / "creds").iterdir()) == []  # nothing written
    applies = {m: len(env.applies(m)) for m in env.machine_names}
    await driver.step()
    assert {m: len(env.applies(m)) for m in env.machine_names} == applies  # nothing applied while it waits

    capsys.readouterr()
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", env.namespace) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{action} Secret {env.namespace}/{env.secret_name}") and nexts["talos"] in out, out
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", env.namespace) == 0  # again: unchanged
    assert "nothing was written" in capsys.readouterr().out
    restored = _store_secret(env, env.secret_name)
    assert restored is not None and names.BUNDLE_LABEL in restored["metadata"]["labels"]
    assert isinstance(await driver.run(max_steps=800), Done)

    final = SecretsBundle.from_yaml(secret_data(env)[names.SECRETS_KEY])
    assert {"talos": ca_fingerprint(final.os), "kubernetes": ca_fingerprint(final.k8s)} == nexts  # the SAME new CAs
    on_nodes = _nodes_fingerprints(env)
    assert on_nodes["os"] == {nexts["talos"][:16]}, on_nodes
    assert set(secret_data(env)) == {names.SECRETS_KEY}
    assert _store_secret(env, copy_name(op["metadata"]["uid"])) is None


async def test_bad_inputs_of_restore_bundle_write_nothing(env: SimEnvironment, driver: Driver,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ns = env.namespace

    def said() -> str:
        return capsys.readouterr().err

    # No rotation under way: nothing to restore.
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 2
    assert "no ca-rotation" in said()
    assert await _cli(env, "restore-bundle", "no-such-cluster", "-n", ns) == 2
    assert "not found" in said()
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", "no-such-namespace") == 2
    said()
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns, "--wait", "0") == 2
    assert "--wait" in said()
    argv = ["cluster", "restore-bundle", env.cluster_name, "--kubeconfig", "/nonexistent/kubeconfig"]
    assert await anyio.to_thread.run_sync(main, argv) == 2
    assert "/nonexistent/kubeconfig" in said()

    await driver.create()
    await driver.run(until=at("Issuing"))
    op = await driver.get()
    before = secret_data(env)
    # The Secret is whole: nothing to write.
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 0
    assert secret_data(env) == before
    # The cluster's secretsRef moved under the rotation: refused (exit 2), nothing written anywhere.
    clusters = crds.clusters(driver.kube)
    await clusters.patch(ns, env.cluster_name, {"spec": {"secretsRef": {"name": "elsewhere"}}})
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 2
    assert "put spec.secretsRef back first" in said()
    assert _store_secret(env, "elsewhere") is None and secret_data(env) == before
    await clusters.patch(ns, env.cluster_name, {"spec": {"secretsRef": {"name": env.secret_name}}})
    # Deleted while another finalizer holds it too: the command cannot replace it (exit 1), and lets nothing go.
    path = f"/api/v1/namespaces/{ns}/secrets/{env.secret_name}"
    held = await driver.kube.raw("GET", path)
    held["metadata"]["finalizers"] = [*held["metadata"]["finalizers"], "example.com/keep"]
    await driver.kube.raw("PUT", path, body=held)
    await driver.kube.raw("DELETE", path)
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 1
    assert "example.com/keep" in said()
    assert names.BUNDLE_CUSTODY_FINALIZER in (_store_secret(env, env.secret_name) or {})["metadata"]["finalizers"]
    # The custody copy gone (and the Secret too): exit 1, nothing created.
    store = env.management.store
    store.delete(store.resolve(*SECRETS), ns, copy_name(op["metadata"]["uid"]))
    await driver.kube.raw("PATCH", path, body={"metadata": {"finalizers": None}},
                          content_type="application/merge-patch+json")  # already deleted: now gone
    assert _store_secret(env, env.secret_name) is None
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 1
    assert "does not exist" in said()
    assert _store_secret(env, env.secret_name) is None
    op = await _until_restore_required(driver)
    assert "does not exist" in (_restore_condition(op) or {}).get("message", "")
    # A copy that is not the operation's (another owner) is never used.
    with contextlib.suppress(ApiError):
        store.create(store.resolve(*SECRETS), ns, {
            "apiVersion": "v1", "kind": "Secret", "type": names.CUSTODY_SECRET_TYPE,
            "metadata": {"name": copy_name(op["metadata"]["uid"]), "namespace": ns,
                         "ownerReferences": [{"apiVersion": names.API_VERSION, "kind": "TalosOperation",
                                              "name": "other", "uid": "not-this-one"}]},
            "data": {names.SECRETS_KEY: base64.b64encode(before[names.SECRETS_KEY]).decode()}})
    assert await _cli(env, "restore-bundle", env.cluster_name, "-n", ns) == 1
    assert "does not exist (or is not that operation's)" in said()
    assert _store_secret(env, env.secret_name) is None


async def test_a_start_killed_after_the_copy_adopts_its_keys(env: SimEnvironment, driver: Driver,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between the custody copy and rotation.yaml: the next start takes the copy's keys, generates none."""
    from ichord.operations.ca_rotation import custody as custody_module
    from tests.integration._ca_rotation_driver import Crash

    def crash(point: str) -> None:
        if point == "ca-rotation.custody.kept":
            monkeypatch.setattr(custody_module, "failpoint", lambda _p: None)
            raise Crash(point)

    monkeypatch.setattr(custody_module, "failpoint", crash)
    await driver.create()
    async def start() -> None:
        for _ in range(10):
            await driver.step()

    with pytest.raises(Crash):
        await start()
    op = await driver.get()
    kept = _store_secret(env, copy_name(op["metadata"]["uid"]))
    assert kept is not None and names.ROTATION_KEY not in secret_data(env)  # the copy only: nothing told yet
    await driver.run(until=at("Accepting"))
    assert secret_data(env)[names.ROTATION_KEY] == base64.b64decode(kept["data"][names.ROTATION_KEY])


async def test_restore_killed_between_letting_go_and_creating_is_finished_by_running_it_again(
        env: SimEnvironment, driver: Driver) -> None:
    """The command killed (failpoint restore.released) after it let a held Secret go, before creating it anew: the
    copy still holds the keys, the rotation still names the command, and running it again finishes the job."""
    await driver.create()
    await driver.run(until=at("Issuing"))
    op = await driver.get()
    nexts = {c["name"]: c["next"] for c in op["status"]["caRotation"]["certificates"]}
    await driver.kube.raw("DELETE", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}")
    await _until_restore_required(driver)
    argv = [sys.executable, "-m", "ichord.cli", "cluster", "restore-bundle", env.cluster_name, "-n", env.namespace,
            "--kubeconfig", str(env.kubeconfig)]
    killed = await anyio.run_process(argv, check=False, env={**os.environ, "ICHORD_FAILPOINTS": "restore.released"})
    assert killed.returncode == 137, killed.stderr
    assert _store_secret(env, env.secret_name) is None  # let go, not created yet
    op = await _until_restore_required(driver)
    assert "was deleted" in (_restore_condition(op) or {})["message"]  # and the copy is there:
    assert "does not exist" not in (_restore_condition(op) or {})["message"]
    again = await anyio.run_process(argv, check=False)
    assert again.returncode == 0 and again.stdout.decode().startswith("created"), again.stderr
    assert isinstance(await driver.run(max_steps=800), Done)
    final = SecretsBundle.from_yaml(secret_data(env)[names.SECRETS_KEY])
    assert {"talos": ca_fingerprint(final.os), "kubernetes": ca_fingerprint(final.k8s)} == nexts
