"""The kubectl commands tests/integration/test_kube_kubectl.py sends the simulator, on the real server:
the facts the simulator is held to (protobuf bodies of ``kubectl create``, Secret type defaulting,
``get events --sort-by``) are the real server's."""

from __future__ import annotations

import json

from tests.integration.test_kube_kubectl import EVENT, NEWER_EVENT
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane


def test_imperative_create_and_sorted_events(control_plane: ControlPlane) -> None:
    kc = control_plane.admin_kubeconfig
    assert "namespace/ops created" in run_kubectl(kc, "create", "namespace", "ops")
    run_kubectl(kc, "create", "secret", "generic", "bundle", "-n", "ops", "--from-literal=a=b", "--from-literal=c=d")
    run_kubectl(kc, "create", "configmap", "settings", "-n", "ops", "--from-literal=k=v")
    run_kubectl(kc, "create", "serviceaccount", "robot", "-n", "ops")
    secret = json.loads(run_kubectl(kc, "get", "secret", "bundle", "-n", "ops", "-o", "json"))
    assert secret["data"] == {"a": "Yg==", "c": "ZA=="} and secret["type"] == "Opaque"
    cm = json.loads(run_kubectl(kc, "get", "configmap", "settings", "-n", "ops", "-o", "json"))
    assert cm["data"] == {"k": "v"} and cm["metadata"]["namespace"] == "ops"
    ns = json.loads(run_kubectl(kc, "get", "namespace", "ops", "-o", "json"))
    assert ns["status"] == {"phase": "Active"} and ns["metadata"]["uid"]
    assert "robot" in run_kubectl(kc, "get", "serviceaccounts", "-n", "ops")
    typed = run_kubectl(kc, "create", "secret", "generic", "typed", "-n", "ops", "--type=example.com/x",
                        "--from-literal=x=y", "--save-config")
    assert "secret/typed created" in typed
    got = json.loads(run_kubectl(kc, "get", "secret", "typed", "-n", "ops", "-o", "json"))
    assert got["type"] == "example.com/x"
    assert json.loads(got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])[
        "type"] == "example.com/x"

    run_kubectl(kc, "create", "-n", "ops", "-f", "-", stdin=NEWER_EVENT.replace("namespace: default", "namespace: ops"))
    run_kubectl(kc, "create", "-n", "ops", "-f", "-", stdin=EVENT.replace("namespace: default", "namespace: ops"))
    rows = run_kubectl(kc, "get", "events", "-n", "ops", "--sort-by=.lastTimestamp", "-o", "name").split()
    assert rows == ["event/cp1.1", "event/cp1.0"]
    rows = run_kubectl(kc, "get", "events", "-n", "ops", "--sort-by=.lastTimestamp").splitlines()
    # As the real server prints events: no NAME column (it is last, in -o wide), OBJECT is kind/name.
    assert rows[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert [r.split()[2:4] for r in rows[1:]] == [["ConfigApplied", "talosmachine/cp1"],
                                                  ["RebootRequired", "talosmachine/cp1"]]
