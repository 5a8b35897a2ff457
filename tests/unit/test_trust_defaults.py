"""Issue 12: the trust pool is on wherever ichord talks to an API server it can be rotated under."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import structlog

from ichord.daemon import DaemonSettings, build_pool
from ichord.kube.errors import KubeConfigError
from ichord.kube.kubeconfig_ca import kubeconfig_ca
from ichord.kube.reachability import Reachability
from ichord.leader import LeadershipLost
from ichord.operations.scope import TrustHooks
from ichord.pki.ca import CAKind, generate_ca
from ichord.run_cli import exit_code_for
from ichord.trust import SharedTrust
from ichord.trust.pool import TrustPool


def _kubeconfig(path: Path, cluster: dict[str, str], *, context: str = "c") -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", **cluster}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def test_the_kubeconfig_ca_file_is_resolved_against_the_kubeconfig_directory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    ca = generate_ca(CAKind.KUBERNETES)
    (tmp_path / "sub" / "ca.crt").write_bytes(ca.cert_pem)
    found = kubeconfig_ca(_kubeconfig(tmp_path / "sub" / "config", {"certificate-authority": "ca.crt"}))
    assert found.file == tmp_path / "sub" / "ca.crt" and found.data is None
    pool = build_pool(DaemonSettings(kubeconfig=str(tmp_path / "sub" / "config")))
    assert pool.base == tmp_path / "sub" / "ca.crt"
    assert [c.subject for c in pool.base_certificates()] == [ca.certificate.subject]


def test_inline_ca_data_is_a_fixed_base_and_a_kubeconfig_without_ca_leaves_none(tmp_path: Path) -> None:
    ca = generate_ca(CAKind.KUBERNETES)
    inline = _kubeconfig(tmp_path / "inline", {"certificate-authority-data": base64.b64encode(ca.cert_pem).decode()})
    pool = build_pool(DaemonSettings(kubeconfig=str(inline)))
    assert pool.has_base and pool.trusts_any([ca.cert_pem])
    assert not pool.trusts_any([generate_ca(CAKind.KUBERNETES).cert_pem])
    bare = build_pool(DaemonSettings(kubeconfig=str(_kubeconfig(tmp_path / "bare", {}))))
    assert not bare.has_base and not bare.trusts_any([ca.cert_pem])


@pytest.mark.parametrize(("content", "match"), [
    (None, "does not exist"),
    ("{", "not valid YAML"),
    ("current-context: nope\ncontexts: []\n", "no context 'nope'"),
])
def test_a_kubeconfig_that_cannot_be_used_names_the_file(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "kc"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KubeConfigError, match=match) as info:
        kubeconfig_ca(path)
    assert str(path) in str(info.value)


def test_a_pool_without_a_base_refuses_kubernetes_ca_rotations_and_no_pool_does_not() -> None:
    current = generate_ca(CAKind.KUBERNETES).cert_pem
    message = SharedTrust(TrustPool(describe_base="nothing"), None).hooks().refusal(current)
    assert message is not None and "no base CA" in message and "--ca-file" in message
    assert SharedTrust(TrustPool(base_data=current, describe_base="inline"), None).rotation_refusal(current) is None
    # --no-trust-pool: the operator's explicit choice, warned at start-up; the actors' default hooks refuse nothing.
    assert TrustHooks().refusal(current) is None


def test_reachability_fails_only_past_the_grace_and_any_answer_resets_it() -> None:
    now = [100.0]
    r = Reachability(clock=lambda: now[0])
    assert r.reachable(30)
    r.failed(ConnectionRefusedError(111, "Connection refused"))
    now[0] += 29
    assert r.reachable(30)
    r.failed(ConnectionRefusedError(111, "Connection refused"))  # still failing: timed from the first
    now[0] += 2
    assert not r.reachable(30) and "unreachable" in r.last_error
    r.ok()
    assert r.reachable(30) and r.since_ok() == 0


def test_leadership_lost_is_one_structured_line_and_exit_1() -> None:
    lost = LeadershipLost("lost the leader Lease ns/ichord-leader: it could not be renewed within 90 s")
    with structlog.testing.capture_logs() as logs:
        assert exit_code_for(BaseExceptionGroup("tree", [ExceptionGroup("inner", [lost])])) == 1
    assert logs == [{"event": "leadership lost; exiting", "cause": str(lost), "exit_code": 1, "log_level": "error"}]
    with structlog.testing.capture_logs() as logs:
        assert exit_code_for(RuntimeError("boom")) == 1
    assert logs[0]["event"] == "ichord run crashed" and logs[0]["error_type"] == "RuntimeError"
    assert exit_code_for(KeyboardInterrupt()) == 130
