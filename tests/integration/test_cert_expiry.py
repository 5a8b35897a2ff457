"""The CA expiry pass against the Kubernetes API simulator over HTTPS (docs/decisions.md#rotation-state,
docs/decisions.md#credentials-handoff).

The CRDs come from helm/ichord/files/crds (the simulator loads them and validates status against them).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ichord import yamlio
from ichord.api.conditions import Condition, find, now_rfc3339, set_condition
from ichord.api.names import (
    BUNDLE_BACKUP_STALE,
    BUNDLE_EXPORTED_ANNOTATION,
    CERTIFICATES_EXPIRING,
    BundleBackupStaleReason,
    CertificatesExpiringReason,
    EventReason,
)
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters
from ichord.kube.events import EventRecorder
from ichord.kube.status import update_status
from ichord.metrics import REGISTRY
from ichord.operations.cert_expiry import expiry_pass, forget_cluster
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca, issue_talos_client_certificate
from ichord.pki.fingerprint import export_fingerprint
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NS = "clusters"
TIMING = Timing().scaled(0.01)
METRIC = "ichord_certificate_expiry_timestamp_seconds"
CERTS = ("talos", "kubernetes", "kubernetes-aggregator", "etcd")
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    # The RSA service-account key takes ~0.5 s: one bundle for the module, CAs swapped with with_cas.
    return generate_bundle()


@dataclass
class Env:
    sim: KubeSimulator
    kube: KubeClient
    recorder: EventRecorder

    async def make_cluster(self, name: str, bundle: SecretsBundle | bytes) -> dict[str, Any]:
        await self.put_secret(f"{name}-bundle", {"secrets.yaml": _raw(bundle)}, create=True)
        return await clusters(self.kube).create(NS, {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"secretsRef": {"name": f"{name}-bundle"}, "endpoint": "https://10.0.0.1:6443",
                     "kubernetesVersion": "1.34.1"}})

    async def put_secret(self, name: str, data: dict[str, bytes | None], *, create: bool = False) -> None:
        encoded = {k: (base64.b64encode(v).decode() if v is not None else None) for k, v in data.items()}
        if create:
            await self.kube.raw("POST", f"/api/v1/namespaces/{NS}/secrets", body={
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                "data": encoded})
        else:
            await self.kube.raw("PATCH", f"/api/v1/namespaces/{NS}/secrets/{name}", body={"data": encoded},
                                content_type=MERGE)

    async def run_pass(self, name: str, *, now: dt.datetime | None = None, warning_days: float = 90) -> float:
        obj = await clusters(self.kube).get(NS, name)
        return await expiry_pass(self.kube, obj, namespace_of_secret=NS, recorder=self.recorder, timing=TIMING,
                                 warning_days=warning_days, now=now)

    async def status(self, name: str) -> dict[str, Any]:
        return dict((await clusters(self.kube).get(NS, name)).get("status") or {})

    async def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        await self.recorder.drain()
        out = await self.kube.raw("GET", f"/api/v1/namespaces/{NS}/events")
        return [e for e in out.get("items") or [] if reason is None or e.get("reason") == reason]

    def writes(self) -> int:
        return sum(self.sim.requests.count(verb=v, resource="talosclusters") for v in ("patch", "update", "create"))


def _raw(bundle: SecretsBundle | bytes) -> bytes:
    return bundle if isinstance(bundle, bytes) else bundle.to_yaml().encode()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with KubeSimulator() as sim:
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc", namespace=NS), timing=TIMING)
        await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        try:
            yield Env(sim, kube, EventRecorder(kube, instance="test"))
        finally:
            await kube.close()


def gauge(name: str, cert: str) -> float | None:
    return REGISTRY.get_sample_value(METRIC, {"namespace": NS, "name": name, "certificate": cert})


def expiring(bundle: SecretsBundle, kind: CAKind, not_after: dt.datetime) -> SecretsBundle:
    return bundle.with_cas({kind: generate_ca(kind, now=not_after - CA_VALIDITY)})


async def test_ca_inside_the_window_sets_condition_event_and_gauge(env: Env, bundle: SecretsBundle) -> None:
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).replace(microsecond=0)
    b = expiring(bundle, CAKind.KUBERNETES, soon)
    await env.make_cluster("c1", b)

    assert await env.run_pass("c1") == TIMING.expiry_reread
    status = await env.status("c1")
    assert [c["name"] for c in status["certificates"]] == list(CERTS)
    k8s = next(c for c in status["certificates"] if c["name"] == "kubernetes")
    assert k8s["notAfter"] == now_rfc3339(soon)
    cond = find(status["conditions"], CERTIFICATES_EXPIRING)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == CertificatesExpiringReason.EXPIRING
    assert f"kubernetes expires on {now_rfc3339(soon)}" in cond["message"]
    events = await env.events(EventReason.CERTIFICATES_EXPIRING)
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert events[0]["involvedObject"]["name"] == "c1" and "kubernetes" in events[0]["message"]
    assert gauge("c1", "kubernetes") == soon.timestamp()
    assert gauge("c1", "talos") == b.os.not_after.timestamp()

    # An hour later nothing changed: no status write, no second Event.
    writes = env.writes()
    assert await env.run_pass("c1", now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)) == TIMING.expiry_reread
    assert env.writes() == writes
    assert len(await env.events(EventReason.CERTIFICATES_EXPIRING)) == 1
    assert find((await env.status("c1"))["conditions"], CERTIFICATES_EXPIRING) == cond
    forget_cluster(NS, "c1")


async def test_a_renewed_bundle_lowers_the_condition(env: Env, bundle: SecretsBundle) -> None:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=10)
    await env.make_cluster("c2", expiring(bundle, CAKind.ETCD, soon))
    await env.run_pass("c2")
    cond = find((await env.status("c2"))["conditions"], CERTIFICATES_EXPIRING)
    assert cond is not None and cond["status"] == "True"

    renewed = bundle.with_cas({k: generate_ca(k) for k in CAKind})
    await env.put_secret("c2-bundle", {"secrets.yaml": _raw(renewed)})
    assert await env.run_pass("c2") == TIMING.expiry_reread
    status = await env.status("c2")
    cond = find(status["conditions"], CERTIFICATES_EXPIRING)
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == CertificatesExpiringReason.NOT_EXPIRING
    etcd = next(c for c in status["certificates"] if c["name"] == "etcd")
    assert etcd["notAfter"] == now_rfc3339(renewed.etcd.not_after)
    assert gauge("c2", "etcd") == renewed.etcd.not_after.replace(microsecond=0).timestamp()
    forget_cluster(NS, "c2")


def _with_os_crt(bundle: SecretsBundle, crt_pem: bytes) -> bytes:
    # Valid YAML, every field present, but certs.os.crt replaced.
    doc: dict[str, Any] = json.loads(json.dumps(yamlio.load(bundle.to_yaml())))
    doc["certs"]["os"]["crt"] = base64.b64encode(crt_pem).decode()
    return yamlio.dump(doc).encode()


# The BundleSource's one vocabulary (issue 13): the reason a condition would carry.
EXPECTED_ERROR = {"missing-secret": "SecretNotFound", "missing-key": "BundleInvalid", "not-yaml": "BundleInvalid",
                  "leaf-not-ca": "BundleInvalid", "not-a-certificate": "BundleInvalid", "binary": "BundleInvalid"}


@pytest.mark.parametrize("case", list(EXPECTED_ERROR))
async def test_an_unreadable_bundle_is_retried_and_nothing_leaks(env: Env, bundle: SecretsBundle,
                                                                 case: str) -> None:
    raw = bundle.to_yaml().encode()
    name = f"bad-{case}"
    await env.make_cluster(name, bundle)
    cases: dict[str, dict[str, bytes | None]] = {
        "missing-key": {"secrets.yaml": None, "other": raw},
        "not-yaml": {"secrets.yaml": raw[:-200] + b"\n  - ]: {" + raw[-200:]},
        "leaf-not-ca": {"secrets.yaml": _with_os_crt(bundle, issue_talos_client_certificate(bundle.os).cert_pem)},
        "not-a-certificate": {"secrets.yaml": _with_os_crt(bundle, bundle.os.key_pem or b"")},
        "binary": {"secrets.yaml": b"\xff\xfe" + raw},
    }
    data = cases.get(case, {})
    if case == "missing-secret":
        await env.kube.raw("DELETE", f"/api/v1/namespaces/{NS}/secrets/{name}-bundle")
    else:
        await env.put_secret(f"{name}-bundle", data)
    env.sim.requests.clear()

    with capture_logs() as logs:
        assert await env.run_pass(name) == TIMING.expiry_retry
    assert env.writes() == 0
    assert await env.status(name) == {}
    assert await env.events() == []
    assert all(gauge(name, c) is None for c in CERTS)
    assert logs and logs[-1]["log_level"] == "warning" and logs[-1]["retry_in"] == TIMING.expiry_retry
    assert logs[-1]["error_type"] == EXPECTED_ERROR[case]
    text = json.dumps(logs, default=str)
    material = [c for s in [*bundle.secret_values(), bundle.os.cert_pem.decode(), bundle.cluster_id]
                for c in _chunks(s)]
    assert any(c in raw.decode() for c in material)  # the detector sees the Secret's own encoding
    for chunk in material:
        assert chunk not in text, f"{case}: material from the Secret reached a log line"
    assert "LS0tLS1" not in text and "BEGIN" not in text


def _chunks(secret: str) -> list[str]:
    # Every 24-character piece of the value, raw and base64 (the forms a careless message would carry).
    flat = "".join(secret.split())
    forms = [flat, base64.b64encode(secret.encode()).decode()]
    return [f[i:i + 24] for f in forms for i in range(0, max(1, len(f) - 24), 24) if len(f[i:i + 24]) == 24]


async def test_a_deleted_clusters_series_are_dropped(env: Env, bundle: SecretsBundle) -> None:
    await env.make_cluster("gone", bundle)
    await env.make_cluster("stays", bundle)
    await env.run_pass("gone")
    await env.run_pass("stays")
    assert all(gauge("gone", c) is not None for c in CERTS)
    await clusters(env.kube).delete(NS, "gone")
    forget_cluster(NS, "gone")
    assert all(gauge("gone", c) is None for c in CERTS)
    assert all(gauge("stays", c) is not None for c in CERTS)
    forget_cluster(NS, "stays")


async def _raise_backup_stale(env: Env, name: str) -> None:
    # What the rotation does at Finalizing (docs/decisions.md#bundle-backup-stale).
    cond = Condition(BUNDLE_BACKUP_STALE, "True", BundleBackupStaleReason.CA_ROTATED,
                     "The CAs were rotated; run `ichord cluster bundle-export` to save the new bundle.")

    def mutate(status: dict[str, Any], _obj: dict[str, Any]) -> dict[str, Any]:
        status["conditions"] = set_condition(status.get("conditions"), cond)
        return status

    await update_status(clusters(env.kube), NS, name, mutate)


async def _annotate(env: Env, name: str, value: str) -> None:
    await clusters(env.kube).patch(NS, name, {"metadata": {"annotations": {BUNDLE_EXPORTED_ANNOTATION: value}}})


async def test_a_stale_export_keeps_backup_stale_and_the_live_one_lowers_it(env: Env, bundle: SecretsBundle) -> None:
    old = bundle
    await env.make_cluster("rot", old)
    await _annotate(env, "rot", export_fingerprint(old))  # the user exported before the rotation
    # An etcd-only rotation: BundleFingerprint unchanged, ExportFingerprint changed
    # (docs/decisions.md#credentials-handoff).
    live = old.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD)})
    await env.put_secret("rot-bundle", {"secrets.yaml": _raw(live)})
    await _raise_backup_stale(env, "rot")

    await env.run_pass("rot")
    stale = find((await env.status("rot"))["conditions"], BUNDLE_BACKUP_STALE)
    assert stale is not None and stale["status"] == "True" and stale["reason"] == BundleBackupStaleReason.CA_ROTATED

    await _annotate(env, "rot", export_fingerprint(live))
    await env.run_pass("rot")
    status = await env.status("rot")
    stale = find(status["conditions"], BUNDLE_BACKUP_STALE)
    assert stale is not None and stale["status"] == "False"
    assert stale["reason"] == BundleBackupStaleReason.BUNDLE_EXPORTED
    assert find(status["conditions"], CERTIFICATES_EXPIRING) is not None  # the pass's own condition kept
    writes = env.writes()
    await env.run_pass("rot")
    assert env.writes() == writes  # lowered once; the next pass writes nothing
    forget_cluster(NS, "rot")
