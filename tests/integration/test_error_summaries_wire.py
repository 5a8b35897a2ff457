"""On the real wire, a refused port and an untrusted API server read as host:port and the root cause."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import anyio
import pytest

from ichord import yamlio
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.errors import TLSVerificationError, Unavailable
from ichord.pki.bundle import generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.pki.scrub import SCRUBBER
from ichord.sim.kube.server import KubeSimulator
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosUnreachableError

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
CLI = "import sys; from ichord import cli; sys.exit(cli.main(sys.argv[1:]))"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_plain(text: str) -> None:
    assert "0x" not in text and "caused by" not in text and "SSLContext" not in text, text


async def test_a_closed_loopback_port(sim: KubeSimulator, tmp_path: Path) -> None:
    port = closed_port()
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = yamlio.load(path.read_text())
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yamlio.dump(cfg))

    async with await from_kubeconfig(path) as kube:
        with pytest.raises(Unavailable) as info:
            await crds.clusters(kube).list_objects("default")
    assert str(info.value) == f"the Kubernetes API server at 127.0.0.1:{port} is unreachable: connection refused"
    assert_plain(SCRUBBER.exception(info.value))
    assert "ConnectionRefusedError" in info.value.detail  # the chain, for the debug log

    # The operator's command says the same in one line; the API not answering is a runtime failure: exit 1.
    proc = await anyio.run_process([sys.executable, "-c", CLI, "cluster", "status", "demo", "-n", "default",
                                    "--kubeconfig", str(path)], check=False)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode() == f"ichord: {info.value}\n"

    async with TalosClient(DialBundle.from_bundle(generate_bundle()), dial_timeout=5) as talos:
        with pytest.raises(TalosUnreachableError) as refused:
            await talos.version(f"127.0.0.1:{port}")
    assert str(refused.value).startswith(f"Talos Version on 127.0.0.1:{port} failed: connection refused. ")
    assert_plain(SCRUBBER.exception(refused.value))


async def test_an_api_server_whose_ca_is_not_trusted(sim: KubeSimulator, tmp_path: Path) -> None:
    other = generate_ca(CAKind.KUBERNETES).cert_pem
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    async with await from_kubeconfig(path, trust=lambda: [other]) as kube:  # negative: the wrong CA
        with pytest.raises(TLSVerificationError) as info:
            await crds.clusters(kube).list_objects("default")
    host, port = sim.url.removeprefix("https://").rsplit(":", 1)
    assert str(info.value) == (f"the Kubernetes API server at {host}:{port}: its certificate is not trusted "
                               "(unable to get local issuer certificate); the trust store must hold the CA that "
                               "signs it")
    assert_plain(SCRUBBER.exception(info.value))
