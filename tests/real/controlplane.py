"""An envtest-like control plane: the real etcd and kube-apiserver on loopback, with certificates made
for the run (ichord.pki), client-certificate and service-account-token authentication, the Node and
RBAC authorizers and the default admission plugins.

``ControlPlane.start()`` writes an admin kubeconfig (system:masters client certificate);
``service_account_kubeconfig()`` makes a ServiceAccount and a kubeconfig with a token from the
TokenRequest API. Both processes log to files in the run directory, which stays after the run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ichord import yamlio
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca, issue_client_certificate
from ichord.sim.kube.certs import issue_serving_certificate
from tests.real import tools

#: Bounded waits of the fixture (the processes' start-up, not anything a test asserts on).
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0
SERVICE_CIDR = "10.96.0.0/16"


class ControlPlaneError(RuntimeError):
    """The control plane did not come up; the message carries the tail of both logs."""


class ToolsMissing(ControlPlaneError):
    """etcd or kube-apiserver has not been built; the message says why (tests/real/tools.missing)."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (all held open while choosing, so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _write_private(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return f"({path} was not written)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ControlPlane:
    """Start with ``start()``, stop with ``stop()``; ``url``, ``admin_kubeconfig``, ``logs``."""

    workdir: Path
    etcd_bin: Path
    apiserver_bin: Path
    kube_ca: CertificateAuthority = field(default_factory=lambda: generate_ca(CAKind.KUBERNETES))
    etcd_ca: CertificateAuthority = field(default_factory=lambda: generate_ca(CAKind.ETCD))
    port: int = 0
    etcd_url: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def logs(self) -> dict[str, Path]:
        return {name: self.workdir / f"{name}.log" for name in ("etcd", "kube-apiserver")}

    @classmethod
    def from_tools(cls, workdir: Path) -> ControlPlane:
        """A control plane (not started) running the binaries scripts/tools.sh built."""
        reason = tools.missing("etcd", "kube-apiserver")
        etcd, apiserver = tools.tool("etcd"), tools.tool("kube-apiserver")
        if reason or etcd is None or apiserver is None:
            raise ToolsMissing(reason or "etcd or kube-apiserver not built")
        return cls(workdir, etcd, apiserver)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        client, peer, self.port = free_ports(3)
        self.etcd_url = self._start_etcd(pki, client, peer)
        self._start_apiserver(pki, self.etcd_url)
        self._write_admin_kubeconfig(pki)
        self._wait_ready()

    def stop(self) -> None:
        for name in ("kube-apiserver", "etcd"):  # the API server first: etcd outliving it is harmless
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)

    def log_tails(self, lines: int = 60) -> str:
        return "\n".join(f"--- {name} ({path}) ---\n{tail(path, lines)}" for name, path in self.logs.items())

    def _spawn(self, name: str, argv: list[str]) -> None:
        with self.logs[name].open("wb") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=self.workdir)

    def _start_etcd(self, pki: Path, client: int, peer: int) -> str:
        serving = issue_serving_certificate(self.etcd_ca, ["127.0.0.1"], client_auth=True)
        (pki / "etcd-ca.crt").write_bytes(self.etcd_ca.cert_pem)
        (pki / "etcd.crt").write_bytes(serving.cert_pem)
        _write_private(pki / "etcd.key", serving.key_pem)
        url = f"https://127.0.0.1:{client}"
        self._spawn("etcd", [
            str(self.etcd_bin), "--name=ichord-test", f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=ichord-test=http://127.0.0.1:{peer}",
            f"--cert-file={pki / 'etcd.crt'}", f"--key-file={pki / 'etcd.key'}",
            f"--trusted-ca-file={pki / 'etcd-ca.crt'}", "--client-cert-auth",
            "--unsafe-no-fsync",  # a throw-away store: fsync only slows the run down
            "--log-level=warn",
        ])
        return url

    def _start_apiserver(self, pki: Path, etcd_url: str) -> None:
        serving = issue_serving_certificate(self.kube_ca, ["127.0.0.1", "10.96.0.1"])
        etcd_client = issue_client_certificate(self.etcd_ca, ["system:masters"], common_name="kube-apiserver")
        sa_key = ec.generate_private_key(ec.SECP256R1())
        (pki / "ca.crt").write_bytes(self.kube_ca.cert_pem)
        (pki / "apiserver.crt").write_bytes(serving.cert_pem)
        _write_private(pki / "apiserver.key", serving.key_pem)
        (pki / "apiserver-etcd-client.crt").write_bytes(etcd_client.cert_pem)
        _write_private(pki / "apiserver-etcd-client.key", etcd_client.key_pem)
        _write_private(pki / "sa.key", sa_key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
        (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
        self._spawn("kube-apiserver", [
            str(self.apiserver_bin),
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--etcd-servers={etcd_url}", f"--etcd-cafile={pki / 'etcd-ca.crt'}",
            f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
            f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # ConfigMap watches are served from etcd, not the watch cache, so compact_etcd() makes an old
            # resourceVersion 410 Gone at once (the differential test's expired watch); nothing else is changed.
            "--watch-cache-sizes=configmaps#0",
            "--v=1",
        ])

    def _write_admin_kubeconfig(self, pki: Path) -> None:
        admin = issue_client_certificate(self.kube_ca, ["system:masters"], common_name="ichord-test-admin")
        _write_private(pki / "admin.crt", admin.cert_pem)
        _write_private(pki / "admin.key", admin.key_pem)
        self._write_kubeconfig(self.admin_kubeconfig, "admin", {
            "client-certificate-data": _b64(admin.cert_pem), "client-key-data": _b64(admin.key_pem)})

    def _write_kubeconfig(self, path: Path, user: str, credentials: dict[str, str],
                          namespace: str = "default") -> Path:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": user,
            "clusters": [{"name": "real", "cluster": {"server": self.url,
                                                      "certificate-authority-data": _b64(self.kube_ca.cert_pem)}}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": user, "context": {"cluster": "real", "user": user, "namespace": namespace}}],
        }
        _write_private(path, yamlio.dump(cfg).encode())
        return path

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {proc.returncode}\n{self.log_tails()}")
            try:
                if self.request("GET", "/readyz") == "ok":
                    return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ControlPlaneError(f"kube-apiserver not ready after {START_TIMEOUT:.0f} s ({last})\n{self.log_tails()}")

    # -- a small admin client (the fixture's own set-up; tests use kubectl or ichord's client) --
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.kube_ca.cert_pem.decode())
        pki = self.workdir / "pki"
        ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return ctx

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as resp:
            text = resp.read().decode()
        with contextlib.suppress(ValueError):
            return json.loads(text)
        return text

    def compact_etcd(self) -> int:
        """Compact etcd to its current revision (etcd's JSON gateway, as kube-apiserver's client); the revision.

        What kube-apiserver itself does every 5 minutes, done now: a watch from an older resourceVersion of
        a resource served from etcd answers 410 Gone."""
        pki = self.workdir / "pki"
        ctx = ssl.create_default_context(cadata=self.etcd_ca.cert_pem.decode())
        ctx.load_cert_chain(pki / "apiserver-etcd-client.crt", pki / "apiserver-etcd-client.key")

        def call(path: str, body: dict[str, Any]) -> Any:
            req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return json.loads(resp.read())

        revision = int(call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        call("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def ensure(self, path: str, body: dict[str, Any]) -> None:
        """POST ``body`` to ``path``; an AlreadyExists is fine."""
        try:
            self.request("POST", path, body)
        except urllib.error.HTTPError as err:
            if err.code != 409:
                raise

    def establish_crds(self, directory: Path) -> list[str]:
        """Create the CRDs in ``directory`` (*.yaml) and wait until each is Established; their names."""
        crds = [doc for path in sorted(directory.glob("*.yaml")) for doc in yamlio.load_all(path.read_text())
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"]
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for crd in crds:
            self.ensure(base, json.loads(json.dumps(crd)))
        names = [str(crd["metadata"]["name"]) for crd in crds]
        deadline = time.monotonic() + START_TIMEOUT
        for name in names:
            while not any(c.get("type") == "Established" and c.get("status") == "True"
                          # A CRD just created can answer "conditions": null (its status not yet written).
                          for c in (self.request("GET", f"{base}/{name}").get("status") or {}).get("conditions")
                          or []):
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRD {name} not Established after {START_TIMEOUT:.0f} s")
                time.sleep(0.1)
        # Established comes before the resource's watch cache is up (a 429 "storage is (re)initializing"
        # until then): a list that answers means the first client writes are served.
        for crd in crds:
            spec = crd["spec"]
            for version in (v["name"] for v in spec["versions"] if v.get("served")):
                path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1"
                while True:
                    try:
                        self.request("GET", path)
                        break
                    except urllib.error.HTTPError as err:
                        if err.code != 429 or time.monotonic() > deadline:
                            raise ControlPlaneError(f"listing {path}: {err}") from err
                    time.sleep(0.1)
        return names

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path,
                                   expiration_seconds: int = 3600) -> Path:
        """A kubeconfig for ServiceAccount ``namespace/name`` (created if missing) with a bound token."""
        self.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds}})
        return self._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}",
                                      {"token": answer["status"]["token"]}, namespace)
