"""What the file-writing commands may replace, and the kubeconfig path a rotation's export hint names
(docs/decisions.md#cli-files)."""

from __future__ import annotations

import shlex
from pathlib import Path

from ichord.api import names
from ichord.credentials.files import earlier_hand_off
from ichord.credentials.handoff import home_relative
from ichord.credentials.mint import kubeconfig, talosconfig
from ichord.operations.ca_rotation.cluster_conditions import minted_kubeconfig
from ichord.pki.ca import CAKind, generate_ca, issue_client_certificate


def _op(recorded: str | None) -> dict[str, object]:
    annotations = {} if recorded is None else {names.CREDENTIALS_KUBECONFIG_ANNOTATION: recorded}
    return {"metadata": {"name": "rot", "annotations": annotations}}


def test_the_export_hint_names_the_kubeconfig_the_hand_off_wrote() -> None:
    assert minted_kubeconfig(_op(None), "demo") == "~/.ichord/clusters/demo/kubeconfig"
    assert minted_kubeconfig(_op("~/creds/kubeconfig"), "demo") == "~/creds/kubeconfig"
    assert minted_kubeconfig(_op("/srv/ops/kubeconfig"), "demo") == "/srv/ops/kubeconfig"
    # An annotation is input: what a shell would run is quoted, and ~ still expands.
    hostile = minted_kubeconfig(_op("~/a b/kubeconfig; rm -rf ~"), "demo")
    assert hostile.startswith("~/'") and shlex.split(f"x {hostile}")[1:] == ["~/a b/kubeconfig; rm -rf ~"]


def test_home_relative(tmp_path: Path) -> None:
    assert home_relative(Path.home() / "x" / "kubeconfig") == "~/x/kubeconfig"
    assert home_relative(Path("/nowhere-near-home/kubeconfig")) == "/nowhere-near-home/kubeconfig"


def test_an_earlier_hand_off_of_the_same_cluster_is_recognised(tmp_path: Path) -> None:
    os_ca, k8s_ca = generate_ca(CAKind.OS), generate_ca(CAKind.KUBERNETES)
    tc, kc = tmp_path / "talosconfig", tmp_path / "kubeconfig"
    tc.write_bytes(talosconfig("demo", ["10.0.0.2"], [os_ca.cert_pem],
                               issue_client_certificate(os_ca, ["os:admin"], common_name="admin")))
    kc.write_bytes(kubeconfig("demo", "https://demo:6443", [k8s_ca.cert_pem],
                              issue_client_certificate(k8s_ca, ["system:masters"], common_name="admin"),
                              namespace="clusters"))
    same = {"cluster": "demo", "server": "https://demo:6443", "namespace": "clusters"}
    assert earlier_hand_off(tc, kc, **same)
    assert not earlier_hand_off(tc, kc, **{**same, "namespace": "other"})  # a same-named cluster elsewhere
    assert not earlier_hand_off(tc, kc, **{**same, "server": "https://other:6443"})
    assert not earlier_hand_off(tc, kc, **{**same, "cluster": "other"})
    kc.write_text("apiVersion: v1\nkind: Config\n")  # someone else's kubeconfig
    assert not earlier_hand_off(tc, kc, **same)
    kc.unlink()
    assert not earlier_hand_off(tc, kc, **same)
