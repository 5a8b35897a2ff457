"""Pure units of the Talos client and simulator: archive reading, endpoints, dial bundles, config
reading for both CA layouts, the v1.13 reboot rule, etcd trust and quorum, generated code freshness."""

from __future__ import annotations

import base64
import gzip
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.render.config import MachineConfig
from ichord.sim.talos.build import node_specs
from ichord.sim.talos.config_view import ConfigInvalidError, read_config
from ichord.sim.talos.etcd import EtcdCluster
from ichord.sim.talos.history import History
from ichord.sim.talos.kubeconfig import admin_kubeconfig, archive
from ichord.sim.talos.node import needs_reboot_v113
from ichord.talos.client import split_endpoint
from ichord.talos.dial import DialBundle, DialBundleError
from ichord.talos.resources import extract_kubeconfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


def _tar(content: bytes, *, end_blocks: bool) -> bytes:
    buf = io.BytesIO()
    info = tarfile.TarInfo("kubeconfig")
    info.size = len(content)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(content))
        end = tar.offset
    data = buf.getvalue()
    return gzip.compress(data if end_blocks else data[:end])


@pytest.mark.parametrize("end_blocks", [True, False])
def test_extract_kubeconfig_with_and_without_end_of_archive(end_blocks: bool) -> None:
    assert extract_kubeconfig(_tar(b"apiVersion: v1\n", end_blocks=end_blocks)) == b"apiVersion: v1\n"


def test_extract_kubeconfig_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not gzip"):
        extract_kubeconfig(b"plain")
    with pytest.raises(ValueError, match="not a tar"):
        extract_kubeconfig(gzip.compress(b""))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("other")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="no file named kubeconfig"):
        extract_kubeconfig(gzip.compress(buf.getvalue()))


def test_simulator_archive_lacks_end_blocks_and_is_readable(bundle: SecretsBundle) -> None:
    cp = node_specs(bundle, V1_14, 1, 0)[0]
    data = archive(admin_kubeconfig(read_config(cp.config)))
    raw = gzip.decompress(data)
    assert len(raw) % 512 == 0
    assert raw[-1024:] != b"\0" * 1024 or len(raw) <= 1024  # no end-of-archive padding
    assert b"current-context: admin@sim" in extract_kubeconfig(data)


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("10.0.0.1", ("10.0.0.1", 50000)), ("10.0.0.1:50001", ("10.0.0.1", 50001)),
    ("[fd00::1]:50002", ("fd00::1", 50002)), ("[fd00::1]", ("fd00::1", 50000)),
    ("node.example", ("node.example", 50000)),
])
def test_split_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == expected


def test_dial_bundle(bundle: SecretsBundle) -> None:
    other = generate_ca(CAKind.OS)
    dial = DialBundle.of(bundle.os, [bundle.os.cert_pem, other.cert_pem + bundle.os.cert_pem])
    assert dial.trusted_cas == (bundle.os.cert_pem, other.cert_pem)  # deduplicated, order kept
    assert dial.fingerprint != DialBundle.from_bundle(bundle).fingerprint
    assert dial.fingerprint != DialBundle.of(bundle.os, dial.trusted_cas, roles=("os:reader",)).fingerprint
    with pytest.raises(DialBundleError, match="private key"):
        DialBundle.of(other.public_only(), [other.cert_pem])
    assert bundle.os.key_pem is not None
    assert bundle.os.key_pem.decode() not in repr(dial)
    cert = dial.client_certificate()
    assert "redacted" in repr(cert)
    ctx = dial.ssl_context(cert)
    assert ctx.check_hostname  # the server is always verified


@pytest.mark.parametrize("contract", [V1_13, V1_14])
def test_read_config_both_layouts(bundle: SecretsBundle, contract: object) -> None:
    cp, worker = node_specs(bundle, contract, 1, 1)  # type: ignore[arg-type]
    v = read_config(cp.config)
    assert v.is_control_plane and v.os_ca.key_pem is not None
    assert v.k8s_issuing is not None and v.k8s_accepted[0] == v.k8s_issuing.signer_pem
    assert v.etcd_ca is not None and v.etcd_ca.signer_pem == bundle.etcd.cert_pem
    w = read_config(worker.config)
    assert not w.is_control_plane and w.os_ca.key_pem is None and w.k8s_issuing is None
    assert w.k8s_accepted == (bundle.k8s.cert_pem,)
    assert w.os_trust == (bundle.os.cert_pem,)


def test_read_config_refuses_both_kubernetes_ca_layouts(bundle: SecretsBundle) -> None:
    cp = node_specs(bundle, V1_14, 1, 0)[0].config.copy()
    cp.v1alpha1["cluster"]["ca"] = {"crt": base64.b64encode(bundle.k8s.cert_pem).decode(), "key": ""}
    with pytest.raises(ConfigInvalidError, match=r"conflicts with cluster\.ca"):
        read_config(cp)


def test_etcd_bundle_first_certificate_signs(bundle: SecretsBundle) -> None:
    new = generate_ca(CAKind.ETCD)
    cp = node_specs(bundle, V1_14, 1, 0)[0].config.copy()
    cp.v1alpha1["cluster"]["etcd"]["ca"]["crt"] = base64.b64encode(new.cert_pem + bundle.etcd.cert_pem).decode()
    v = read_config(cp)
    assert v.etcd_ca is not None
    assert v.etcd_ca.signer_pem == new.cert_pem
    assert v.etcd_ca.certificates == [new.cert_pem, bundle.etcd.cert_pem]


def test_needs_reboot_v113(bundle: SecretsBundle) -> None:
    cfg = node_specs(bundle, V1_13, 1, 0)[0].config
    changed = cfg.copy()
    changed.v1alpha1["machine"]["certSANs"] = ["a.example"]
    changed.v1alpha1["cluster"]["clusterName"] = "renamed"
    assert needs_reboot_v113(cfg, changed) == []
    changed.v1alpha1["machine"]["token"] = "x"
    changed.v1alpha1["machine"]["type"] = "worker"
    assert needs_reboot_v113(cfg, changed) == [".machine.token", ".machine.type"]
    assert needs_reboot_v113(cfg, MachineConfig([d for d in cfg.documents])) == []


def test_etcd_trust_and_quorum() -> None:
    old, new = generate_ca(CAKind.ETCD), generate_ca(CAKind.ETCD)
    etcd = EtcdCluster(History())
    for name in ("a", "b", "c"):
        etcd.start_member(name, "127.0.0.1", old.cert_pem)
    assert etcd.has_quorum and etcd.leader == "a"
    etcd.stop_member("a")
    etcd.start_member("a", "127.0.0.1", new.cert_pem)  # a member on a CA its peers do not trust
    assert not etcd.healthy("a") and etcd.healthy("b") and etcd.leader in ("b", "c")
    assert etcd.peer_errors("a")
    etcd.stop_member("b")
    assert not etcd.has_quorum and etcd.leader is None
    etcd.start_member("b", "127.0.0.1", new.cert_pem + old.cert_pem)  # signs with new, trusts both
    assert etcd.healthy("a") and etcd.healthy("b") and not etcd.healthy("c")
    kinds = [e["kind"] for e in etcd.history.events]
    assert "etcd_quorum_lost" in kinds and "etcd_quorum_regained" in kinds


def test_generated_code_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
