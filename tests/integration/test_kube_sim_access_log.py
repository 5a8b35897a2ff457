"""The API simulator records every resource request with the identity that made it, as RBAC sees it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from ichord import yamlio
from ichord.kube.client import from_kubeconfig
from ichord.pki.ca import CAKind, generate_ca, issue_client_certificate
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.sim.kube.faults import Access

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_requests_are_recorded_per_identity(tmp_path: Path) -> None:
    ca = generate_ca(CAKind.KUBERNETES)
    async with KubeSimulator(SimSettings(token="admin-token", client_cas=(ca.cert_pem,))) as sim:
        sim.add_user("daemon-token", "system:serviceaccount:ichord-system:ichord")
        daemon_cfg = sim.write_kubeconfig(tmp_path / "daemon", namespace="ichord-system", token="daemon-token")
        admin_cfg = sim.write_kubeconfig(tmp_path / "admin")
        cert = issue_client_certificate(ca, ("system:masters",), common_name="admin@talos")
        doc = yamlio.load(admin_cfg.read_text())
        doc["users"][0]["user"] = {"client-certificate-data": base64.b64encode(cert.cert_pem).decode(),
                                   "client-key-data": base64.b64encode(cert.key_pem).decode()}
        x509_cfg = tmp_path / "x509"
        x509_cfg.write_text(yamlio.dump(doc))
        wrong = sim.write_kubeconfig(tmp_path / "wrong", token="nope")
        async with await from_kubeconfig(daemon_cfg) as daemon:
            await daemon.raw("GET", "/api/v1/namespaces/ichord-system/secrets",
                             query=[("fieldSelector", "metadata.name=bundle")])
            await daemon.raw("PATCH", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
                             body={"metadata": {"labels": {"a": "b"}}}, content_type="application/merge-patch+json")
        async with await from_kubeconfig(admin_cfg) as admin:
            await admin.raw("GET", "/api/v1/nodes")
        async with await from_kubeconfig(x509_cfg) as x509:
            await x509.raw("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                           query=[("watch", "true"), ("timeoutSeconds", "1")], stream=True)
        async with await from_kubeconfig(wrong) as stranger:
            with pytest.raises(Exception, match="Unauthorized"):
                await stranger.raw("GET", "/api/v1/nodes")
        assert sim.requests.by_user("system:serviceaccount:ichord-system:ichord") == [
            Access("system:serviceaccount:ichord-system:ichord", "list", "", "secrets", "", "ichord-system", "bundle"),
            Access("system:serviceaccount:ichord-system:ichord", "patch", "", "configmaps", "", "default",
                   "kube-root-ca.crt")]
        assert sim.requests.by_user("ichord-sim") == [Access("ichord-sim", "list", "", "nodes", "", "", "")]
        assert [(a.verb, a.group, a.resource, a.namespace) for a in sim.requests.by_user("admin@talos")] == [
            ("watch", "coordination.k8s.io", "leases", "default")]
        # A request that does not authenticate reaches no authorizer: not recorded.
        assert sim.requests.users() == {"system:serviceaccount:ichord-system:ichord", "ichord-sim", "admin@talos"}
        assert sim.requests.count(status=401) == 1
