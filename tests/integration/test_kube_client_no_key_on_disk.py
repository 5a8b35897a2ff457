"""A kubeconfig's client key never lands in a file: not in the temp directory, not behind an open fd.

kubernetes-asyncio would write ``client-key-data`` to a temporary file kept until the process
exits; ichord's loader keeps the certificate and key in memory and hands them to OpenSSL through a
memfd (or a private directory removed at once). Checked against the API simulator's x509 auth.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ichord import yamlio
from ichord.kube import client as kube_client
from ichord.kube.client import from_kubeconfig, from_kubeconfig_data
from ichord.kube.errors import KubeConfigError
from ichord.pki.ca import CAKind, generate_ca, issue_client_certificate
from ichord.sim.kube import KubeSimulator, SimSettings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(path: Path, server: str, ca: bytes, user: dict[str, str]) -> Path:
    path.write_text(yamlio.dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin@c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": "admin@c", "user": user}],
        "contexts": [{"name": "admin@c", "context": {"cluster": "c", "user": "admin@c", "namespace": "kube-system"}}],
    }))
    return path


def files_under(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            yield Path(dirpath) / name


def open_key_fds() -> list[str]:
    """This process's open fds that are memfds or regular files holding a PEM private key."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:"):
            out.append(target)
        elif target.startswith("/") and os.path.isfile(target):
            try:
                if b"PRIVATE KEY" in Path(target).read_bytes():
                    out.append(target)
            except OSError:
                continue
    return out


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every temporary file of this process (tempfile's default directory) goes under one directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "private-dir"])
async def test_the_client_key_is_used_from_memory(tmp_path: Path, private_tmp: Path, memfd: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if not memfd:
        monkeypatch.setattr(kube_client, "_PROC_FD", tmp_path / "no-proc")
    ca = generate_ca(CAKind.KUBERNETES)
    cert = issue_client_certificate(ca, ("system:masters",), common_name="admin")
    async with KubeSimulator(SimSettings(token="not-sent", client_cas=(ca.cert_pem,))) as sim:
        kubeconfig = write_kubeconfig(tmp_path / "admin.kubeconfig", sim.url, sim.ca_pem, {
            "client-certificate-data": _b64(cert.cert_pem), "client-key-data": _b64(cert.key_pem)})
        async with await from_kubeconfig(kubeconfig) as kube:
            assert kube.namespace == "kube-system"
            assert (await kube.raw("GET", "/api/v1/namespaces"))["items"]  # authenticated by the certificate
            new = generate_ca(CAKind.KUBERNETES)
            await sim.switch_serving_ca(new)
            # A new trust set builds a new SSLContext, which loads the key again.
            kube._session._trust = lambda: [new.cert_pem]
            assert (await kube.raw("GET", "/api/v1/namespaces"))["items"]
            assert list(files_under(private_tmp)) == []
            assert open_key_fds() == []
        assert sim.x509_failures == []
        assert sim.requests.count(status=200) == 2
    assert list(files_under(private_tmp)) == []


async def test_key_files_named_by_path_are_read_not_copied(tmp_path: Path, private_tmp: Path) -> None:
    ca = generate_ca(CAKind.KUBERNETES)
    cert = issue_client_certificate(ca, ("system:masters",), common_name="admin")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "admin.crt").write_bytes(cert.cert_pem)
    (creds / "admin.key").write_bytes(cert.key_pem)
    async with KubeSimulator(SimSettings(token="not-sent", client_cas=(ca.cert_pem,))) as sim:
        # Relative paths resolve against the kubeconfig's directory, as kubectl does.
        kubeconfig = write_kubeconfig(creds / "kubeconfig", sim.url, sim.ca_pem, {
            "client-certificate": "admin.crt", "client-key": "admin.key"})
        async with await from_kubeconfig(kubeconfig) as kube:
            assert (await kube.raw("GET", "/api/v1/namespaces"))["items"]
    assert list(files_under(private_tmp)) == []


async def test_a_key_that_does_not_match_is_refused_without_showing_it(tmp_path: Path, private_tmp: Path) -> None:
    ca = generate_ca(CAKind.KUBERNETES)
    one = issue_client_certificate(ca, ("system:masters",), common_name="admin")
    other = issue_client_certificate(ca, ("system:masters",), common_name="admin")
    kubeconfig = write_kubeconfig(tmp_path / "k", "https://127.0.0.1:1", ca.cert_pem, {
        "client-certificate-data": _b64(one.cert_pem), "client-key-data": _b64(other.key_pem)})
    with pytest.raises(KubeConfigError, match="client certificate and key do not load") as err:
        await from_kubeconfig(kubeconfig)
    assert "PRIVATE KEY" not in str(err.value) and other.key_pem.decode().splitlines()[1] not in str(err.value)
    half = write_kubeconfig(tmp_path / "h", "https://127.0.0.1:1", ca.cert_pem,
                            {"client-certificate-data": _b64(one.cert_pem)})
    with pytest.raises(KubeConfigError, match="without its key"):
        await from_kubeconfig(half)
    assert list(files_under(private_tmp)) == []


async def test_a_kubeconfig_in_memory_writes_no_file_at_all(tmp_path: Path, private_tmp: Path) -> None:
    """The admin kubeconfig a Talos node issues can be used straight from the bytes received."""
    ca = generate_ca(CAKind.KUBERNETES)
    cert = issue_client_certificate(ca, ("system:masters",), common_name="admin")
    async with KubeSimulator(SimSettings(token="not-sent", client_cas=(ca.cert_pem,))) as sim:
        data = write_kubeconfig(tmp_path / "k", sim.url, sim.ca_pem, {
            "client-certificate-data": _b64(cert.cert_pem), "client-key-data": _b64(cert.key_pem)}).read_bytes()
        (tmp_path / "k").unlink()
        async with await from_kubeconfig_data(data, what="the admin kubeconfig of cp-1") as kube:
            assert kube.namespace == "kube-system"
            assert (await kube.raw("GET", "/api/v1/namespaces"))["items"]
            assert open_key_fds() == []
        assert sim.requests.by_user("admin")
    assert list(files_under(private_tmp)) == []
    with pytest.raises(KubeConfigError, match="the admin kubeconfig of cp-1: it is not YAML"):
        await from_kubeconfig_data(b"{", what="the admin kubeconfig of cp-1")
    with pytest.raises(KubeConfigError, match="no context named"):
        await from_kubeconfig_data(b"apiVersion: v1\nkind: Config\n", what="x")
