"""The combined environment (`ichord sim`): Talos nodes, their own Kubernetes API, ichord's objects."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes_asyncio.client.exceptions import ApiException

from ichord import yamlio
from ichord.api.carotation import Stage
from ichord.api.names import GROUP, SECRETS_KEY, VERSION
from ichord.contract import V1_13
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import Unavailable, translate
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.certs import sign_leaf
from ichord.sim.talos.testing import eventually
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.dial import DialBundle

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SCALE = 0.02  # reboot 40 ms, kubelet restart 20 ms, API server restart 60 ms


@pytest.fixture
async def talos(bundle: SecretsBundle) -> AsyncIterator[TalosClient]:
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as c:
        yield c


async def admin_client(env: SimEnvironment, talos: TalosClient, tmp_path: Path, machine: str,
                       name: str = "admin") -> KubeClient:
    """A client from the admin kubeconfig a control plane issues (Kubeconfig RPC, real mTLS)."""
    path = tmp_path / f"{name}.kubeconfig"
    path.write_bytes(await talos.kubeconfig(env.endpoints[machine]))
    return await from_kubeconfig(path)


def ready_of(node: object) -> str:
    conds = node.status.conditions or []  # type: ignore[attr-defined]
    return str(next(c.status for c in conds if c.type == "Ready"))


async def test_every_node_runs_the_render_of_the_objects_it_was_created_with(
        env: SimEnvironment, talos: TalosClient) -> None:
    store = env.management.store
    cluster = store.get(store.resolve(GROUP, VERSION, "talosclusters"), env.namespace, env.cluster_name)
    machines = store.list(store.resolve(GROUP, VERSION, "talosmachines"), env.namespace)[0]
    assert sorted(m["metadata"]["name"] for m in machines) == sorted(env.machine_names)
    assert len(env.machine_names) == 4
    inputs = ClusterInputs.from_spec(cluster["metadata"]["name"], cluster["spec"])
    roles = {}
    for m in machines:
        expected = render(env.bundle, inputs, MachineInputs.from_spec(m["spec"]))  # type: ignore[arg-type]
        name = m["metadata"]["name"]
        running = MachineConfig.parse(await talos.machine_config(m["spec"]["address"]))
        assert running.hash() == expected.hash(), name
        roles[name] = m["spec"]["role"]
        assert m["spec"]["approved"] is True
    assert sorted(roles.values()) == ["controlplane"] * 3 + ["worker"]
    assert cluster["spec"]["endpoint"] == env.kube.url
    assert cluster["spec"]["cni"] == {"preset": "flannel"}


async def test_written_kubeconfig_reads_the_objects_and_the_bundle_secret(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig) as kc:
        assert kc.namespace == env.namespace
        listed = await kc.custom().list_namespaced_custom_object(GROUP, VERSION, env.namespace, "talosmachines")
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == sorted(env.machine_names)
        cluster = await kc.custom().get_namespaced_custom_object(GROUP, VERSION, env.namespace, "talosclusters",
                                                                 env.cluster_name)
        secret = await kc.core().read_namespaced_secret(cluster["spec"]["secretsRef"]["name"], env.namespace)
        assert env.bundle is not None
        assert base64.b64decode(secret.data[SECRETS_KEY]).decode() == env.bundle.to_yaml()
        nodes = await kc.core().list_node()
    by_name = {n.metadata.name: n for n in nodes.items}
    assert sorted(by_name) == sorted(env.talos.nodes[m].nodename for m in env.machine_names)
    for plan in env.machines:
        node = by_name[env.talos.nodes[plan.name].nodename]
        assert [a.address for a in node.status.addresses if a.type == "InternalIP"] == [plan.ip]
        assert ("node-role.kubernetes.io/control-plane" in node.metadata.labels) == (plan.role == "controlplane")
        assert ready_of(node) == "True"
        assert node.status.node_info.boot_id == env.talos.nodes[plan.name].boot_id


async def test_admin_kubeconfig_from_a_node_authenticates_and_a_foreign_ca_gets_401(
        env: SimEnvironment, talos: TalosClient, tmp_path: Path) -> None:
    async with await admin_client(env, talos, tmp_path, env.machine_names[1]) as admin:
        assert admin.host == env.kube.url
        nodes = await admin.core().list_node()
        assert len(nodes.items) == 4
    # The same kubeconfig with a client certificate from an unrelated CA: 401, recorded.
    doc = yamlio.load((tmp_path / "admin.kubeconfig").read_text())
    foreign = generate_ca(CAKind.KUBERNETES)
    assert foreign.key_pem is not None
    cert, key = sign_leaf(foreign.cert_pem, foreign.key_pem, common_name="admin", organizations=("system:masters",),
                          usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), validity=dt.timedelta(days=1))
    doc["users"][0]["user"] = {"client-certificate-data": base64.b64encode(cert).decode(),
                               "client-key-data": base64.b64encode(key).decode()}
    (tmp_path / "foreign.kubeconfig").write_text(yamlio.dump(doc))
    async with await from_kubeconfig(tmp_path / "foreign.kubeconfig") as stranger:
        with pytest.raises(ApiException) as err:
            await stranger.core().list_node()
    assert err.value.status == 401
    assert [f["reason"] for f in env.kube.x509_failures] == ["x509: certificate signed by unknown authority"]
    assert env.state()["kubernetes"]["managed"]["requests"]["list"]["401"] == 1


async def apply_stage(env: SimEnvironment, talos: TalosClient, rotation: Rotation, stage: Stage,
                      machines: list[str]) -> None:
    assert env.bundle is not None
    for name in machines:
        cfg = render_stage(env.bundle, rotation, stage, env.cluster_inputs(), env.machine_inputs(name))
        await talos.apply_configuration(env.endpoints[name], cfg.to_yaml().encode(), ApplyMode.NO_REBOOT,
                                        contract=env.contract)


async def test_kubernetes_ca_change_restarts_the_kubelet_and_the_node_goes_not_ready_then_ready(
        env: SimEnvironment, talos: TalosClient) -> None:
    worker = env.machine_names[-1]
    nodename = env.node(worker).nodename
    rotation = generate_rotation((Target.KUBERNETES,))
    await apply_stage(env, talos, rotation, Stage.ACCEPTING, [worker])
    await eventually(lambda: [r["status"] for r in env.follower.readiness if r["node"] == nodename][-2:]
                     == ["False", "True"], within=3)
    assert env.node_ready(worker) == "True"
    assert len(env.applies(worker)) == 1 and env.applies(worker)[0][1] == "NO_REBOOT"
    assert all(env.applies(m) == [] for m in env.machine_names[:-1])


async def test_api_server_follows_the_control_planes_client_and_serving_cas(
        env: SimEnvironment, talos: TalosClient, tmp_path: Path) -> None:
    rotation = generate_rotation((Target.KUBERNETES,))
    new_ca = rotation.new[Target.KUBERNETES]
    assert new_ca.key_pem is not None
    old_serving = env.kube.ca.cert_pem
    cps = env.machine_names[:3]
    kubeconfig = yamlio.load((await talos.kubeconfig(env.endpoints[cps[0]])).decode())
    cert, key = sign_leaf(new_ca.cert_pem, new_ca.key_pem, common_name="admin", organizations=("system:masters",),
                          usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), validity=dt.timedelta(days=1))
    kubeconfig["users"][0]["user"] = {"client-certificate-data": base64.b64encode(cert).decode(),
                                      "client-key-data": base64.b64encode(key).decode()}
    (tmp_path / "new-ca.kubeconfig").write_text(yamlio.dump(kubeconfig))

    # Accepting on one control plane only: the other two API servers still refuse the new CA's
    # certificates, and a request may reach any of them, so the API refuses them.
    await apply_stage(env, talos, rotation, Stage.ACCEPTING, cps[:1])
    await eventually(lambda: env.follower.apiservers[cps[0]].accepted[-1] == new_ca.cert_pem, within=3)
    await env.sync_from_nodes()
    async with await from_kubeconfig(tmp_path / "new-ca.kubeconfig") as early:
        with pytest.raises(ApiException) as err:
            await early.core().list_node()
        assert err.value.status == 401
    # Accepting everywhere: accepted, while the API still serves with the old (issuing) CA.
    await apply_stage(env, talos, rotation, Stage.ACCEPTING, cps[1:])
    await eventually(lambda: new_ca.cert_pem in (env.kube.client_auth.cas if env.kube.client_auth else ()),
                     within=3)
    async with await from_kubeconfig(tmp_path / "new-ca.kubeconfig") as accepted:
        assert len((await accepted.core().list_node()).items) == 4
    assert env.kube.ca.cert_pem == old_serving
    # Issuing on the first control plane: its restarted API server serves with the new CA, and
    # kube-controller-manager republishes kube-root-ca.crt with it after its restart.
    await apply_stage(env, talos, rotation, Stage.ISSUING, cps[:1])
    await eventually(lambda: env.kube.ca.cert_pem == new_ca.cert_pem, within=3)
    assert env.kube.outages[-1]["kind"] == "serving_ca_switch"
    async with await admin_client(env, talos, tmp_path, cps[0], "issued") as issued:
        assert len((await issued.core().list_node()).items) == 4
    cm_rt = env.kube.store.resolve("", "v1", "configmaps")
    await eventually(lambda: env.kube.store.get(cm_rt, "default", "kube-root-ca.crt")["data"]["ca.crt"]
                     == new_ca.cert_pem.decode(), within=3)


async def test_sync_from_nodes_is_idempotent_and_keeps_the_bundle_ca(env: SimEnvironment) -> None:
    assert env.bundle is not None
    outages = len(env.kube.outages)
    await env.sync_from_nodes()
    await env.sync_from_nodes()
    assert env.kube.ca.cert_pem == env.bundle.k8s.cert_pem
    assert env.kube.client_auth is not None and env.kube.client_auth.cas == (env.bundle.k8s.cert_pem,)
    assert len(env.kube.outages) == outages


async def test_unreachable_node_is_unknown_then_ready_and_reboot_flips_it(
        env: SimEnvironment, talos: TalosClient) -> None:
    cp = env.machine_names[1]
    await env.set_unreachable(cp)
    assert env.node_ready(cp) == "Unknown"
    assert env.state()["talos"]["nodes"][cp]["up"] is False
    await env.set_unreachable(cp, False)
    assert env.node_ready(cp) == "True"
    boot = env.node(cp).boot_id
    await talos.reboot(env.endpoints[cp])
    await eventually(lambda: env.node_ready(cp) == "Unknown", within=2)
    await eventually(lambda: env.node_ready(cp) == "True" and env.node(cp).boot_id != boot, within=3)


async def test_separate_management_api_holds_the_objects_and_the_managed_one_the_nodes(
        bundle: SecretsBundle, talos: TalosClient, tmp_path: Path) -> None:
    async with SimEnvironment(bundle=bundle, control_planes=1, workers=1, time_scale=SCALE,
                              management_api="separate", cluster_name="prod") as env:
        assert env.management is not env.kube and env.management.url != env.kube.url
        async with await from_kubeconfig(env.kubeconfig) as kc:
            assert kc.host == env.management.url
            listed = await kc.custom().list_namespaced_custom_object(GROUP, VERSION, env.namespace, "talosmachines")
            assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["prod-cp-1", "prod-worker-1"]
            assert (await kc.core().list_node()).items == []
        async with await admin_client(env, talos, tmp_path, "prod-cp-1") as admin:
            assert admin.host == env.kube.url
            assert len((await admin.core().list_node()).items) == 2
            with pytest.raises(ApiException) as err:
                await admin.custom().list_namespaced_custom_object(GROUP, VERSION, env.namespace, "talosmachines")
            assert err.value.status == 404
        assert "management" in env.state()["kubernetes"]


async def test_lone_control_plane_takes_the_api_down_while_it_reboots_v113(
        bundle: SecretsBundle, talos: TalosClient) -> None:
    async with SimEnvironment(bundle=bundle, control_planes=1, workers=0, contract=V1_13,
                              time_scale=SCALE) as env:
        cp = env.machine_names[0]
        assert env.state()["talos"]["version"] == "v1.13"
        async with await from_kubeconfig(env.kubeconfig) as kc:
            assert len((await kc.core().list_node()).items) == 1
            await talos.reboot(env.endpoints[cp])
            await eventually(lambda: env.kube.down, within=2)
            with pytest.raises(Unavailable), translate():
                await kc.core().list_node()
            await eventually(lambda: not env.kube.down and env.node_ready(cp) == "True", within=3)
            assert len((await kc.core().list_node()).items) == 1
        assert [o["kind"] for o in env.kube.outages] == ["down", "up"]


async def test_any_free_talos_port_is_what_the_objects_name(bundle: SecretsBundle) -> None:
    async with SimEnvironment(bundle=bundle, talos_port=0, workers=0, control_planes=1) as env:
        for m in env.machines:
            node = env.talos.nodes[m.name]
            assert node.port != 0
            assert env.machine_specs[m.name]["address"] == node.endpoint == m.address
