"""The pure decisions of the ca-rotation: targets, stage sequence, plan, token, credentials, restarts, timers."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ichord.api.carotation import Stage
from ichord.api.conditions import Condition, find
from ichord.api.max_unavailable import DEFAULT, resolve
from ichord.api.names import CA_ROTATION_TEMPLATE_ANNOTATION
from ichord.contract import V1_13, V1_14
from ichord.operations.ca_rotation import clients
from ichord.operations.ca_rotation.handoff import acknowledged
from ichord.operations.ca_rotation.plan import (
    PlannedMachine,
    TargetSpecError,
    apply_dial,
    certificates_status,
    contract_refusal,
    handoff_token,
    next_stage,
    plan_status,
    replaced_by,
    spec_targets,
    stages,
    verify_dial,
)
from ichord.operations.ca_rotation.status import set_ca_condition, since_transition
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation, Target, generate_rotation

T, K = Target.TALOS, Target.KUBERNETES


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
def rotation() -> Rotation:
    return generate_rotation((T, K))


def op(targets: list[str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "ca-rotation"}
    if targets is not None:
        spec["caRotation"] = {"targets": targets}
    return {"spec": spec}


@pytest.mark.parametrize(("targets", "want"), [
    (None, (T, K)),
    ([], (T, K)),
    (["kubernetes"], (K,)),
    (["kubernetes", "talos"], (T, K)),
])
def test_spec_targets(targets: list[str] | None, want: tuple[Target, ...]) -> None:
    assert spec_targets(op(targets)) == want


def test_etcd_is_accepted() -> None:
    assert spec_targets(op(["kubernetes", "etcd"])) == (K, Target.ETCD)


def test_an_etcd_plan_reboots_the_control_planes_and_says_how_often() -> None:
    machines = [PlannedMachine("w-1", "worker"), *(PlannedMachine(f"cp-{i}", "controlplane") for i in (1, 2, 3))]
    plan = plan_status((Target.ETCD,), machines)
    assert [(m["name"], m["reboots"]) for m in plan["machines"]] == [
        ("cp-1", True), ("cp-2", True), ("cp-3", True), ("w-1", False)]
    assert any("three reboots per control plane, 9 for 3" in w for w in plan["warnings"])
    assert any("etcd snapshot" in w and "ichord cluster etcd-snapshot NAME -f FILE" in w for w in plan["warnings"])
    assert "etcdSnapshot" not in plan
    named = plan_status((Target.ETCD,), machines, etcd_snapshot={"directory": "/var/lib/ichord/snapshots",
                                                                 "retain": 5})
    assert named["etcdSnapshot"] == {"directory": "/var/lib/ichord/snapshots", "retain": 5}
    assert any("an etcd snapshot is taken to /var/lib/ichord/snapshots before the first reboot" in w
               for w in named["warnings"])
    assert "etcdSnapshot" not in plan_status((Target.TALOS,), machines, etcd_snapshot=named["etcdSnapshot"])
    assert not any("AwaitingCredentials" in w for w in plan["warnings"])
    assert plan["kubernetesAPIUnavailable"] is False
    assert "workerBound" not in plan
    bound = resolve(None, None, DEFAULT, 100)
    assert plan_status((Target.ETCD,), machines, bound)["workerBound"] == {
        "atOnce": 25, "maxUnavailable": "25%", "source": "daemon", "workers": 100,
        "message": "workers 25 at a time (maxUnavailable 25% of 100 workers, the daemon's --max-unavailable)"}
    for targets in ((Target.ETCD,), (Target.KUBERNETES_AGGREGATOR,), (K,)):
        lone = plan_status(targets, [PlannedMachine("cp-1", "controlplane"), PlannedMachine("w-1", "worker")])
        assert lone["kubernetesAPIUnavailable"] is True, targets


def test_the_aggregator_is_refused_on_a_contract_older_than_v1_14() -> None:
    targets = spec_targets(op(["talos", "kubernetes-aggregator"]))
    assert contract_refusal(targets, V1_14) is None
    refusal = contract_refusal(targets, V1_13)
    assert refusal is not None and "v1.14" in refusal
    assert contract_refusal(spec_targets(op(["talos"])), V1_13) is None


def test_the_plan_of_an_aggregator_rotation_says_extension_api_servers_are_the_owners_to_restart() -> None:
    plan = plan_status((Target.KUBERNETES_AGGREGATOR,), [PlannedMachine("cp", "controlplane")])
    assert any("metrics-server" in w and "owners" in w for w in plan["warnings"])
    assert not any("metrics-server" in w for w in plan_status((T, K), [PlannedMachine("cp", "controlplane")])[
        "warnings"])


@pytest.mark.parametrize("targets", [["vault"], ["talos", "talos"]])
def test_malformed_targets(targets: list[str]) -> None:
    with pytest.raises(TargetSpecError):
        spec_targets(op(targets))


@pytest.mark.parametrize(("targets", "want"), [
    ((T, K), ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing"]),
    ((K,), ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing"]),
    ((Target.ETCD,), ["Accepting", "Issuing", "Dropping", "Finalizing"]),  # no hand-off without talos/kubernetes
])
def test_stage_sequence(targets: tuple[Target, ...], want: list[str]) -> None:
    assert [s.value for s in stages(targets)] == want


@pytest.mark.parametrize(("stage", "targets", "want"), [
    (Stage.ACCEPTING, (T, K), Stage.AWAITING_CREDENTIALS),
    (Stage.ACCEPTING, (Target.ETCD,), Stage.ISSUING),
    (Stage.AWAITING_CREDENTIALS, (T,), Stage.ISSUING),
    (Stage.ISSUING, (T, K), Stage.DROPPING),
    (Stage.DROPPING, (T, K), Stage.FINALIZING),
    (Stage.FINALIZING, (T, K), Stage.DONE),
    (Stage.DONE, (T, K), Stage.DONE),
])
def test_next_stage_only_moves_forward(stage: Stage, targets: tuple[Target, ...], want: Stage) -> None:
    assert next_stage(stage, targets) is want


def test_plan_orders_control_planes_first_and_flags_a_lone_control_plane() -> None:
    machines = [PlannedMachine("w-1", "worker"), PlannedMachine("cp-2", "controlplane"),
                PlannedMachine("cp-1", "controlplane")]
    plan = plan_status((T, K), machines)
    assert [(m["name"], m["order"], m["reboots"]) for m in plan["machines"]] == [
        ("cp-1", 1, False), ("cp-2", 2, False), ("w-1", 3, False)]
    assert plan["targets"] == ["talos", "kubernetes"] and plan["kubernetesAPIUnavailable"] is False
    assert any("bundle-export" in w for w in plan["warnings"])
    lone = plan_status((T, K), [PlannedMachine("cp-1", "controlplane"), PlannedMachine("w-1", "worker")])
    assert lone["kubernetesAPIUnavailable"] is True
    assert plan_status((T,), [PlannedMachine("cp-1", "controlplane")])["kubernetesAPIUnavailable"] is False


def test_certificates_per_stage(bundle: SecretsBundle, rotation: Rotation) -> None:
    old, new = ca_fingerprint(bundle.os), ca_fingerprint(rotation.new[T])
    rows = {
        Stage.ACCEPTING: (old, [old, new]),
        Stage.AWAITING_CREDENTIALS: (old, [old, new]),
        Stage.ISSUING: (new, [new, old]),
        Stage.DROPPING: (new, [new]),
    }
    for stage, (issuing, accepted) in rows.items():
        talos = certificates_status(bundle, rotation, stage)[0]
        assert talos == {"name": "talos", "previous": old, "next": new, "issuing": issuing, "accepted": accepted}


def test_handoff_token_and_acknowledgement(bundle: SecretsBundle, rotation: Rotation) -> None:
    certs = certificates_status(bundle, rotation, Stage.AWAITING_CREDENTIALS)
    token = handoff_token(certs)
    assert token == f"talos={ca_fingerprint(rotation.new[T])},kubernetes={ca_fingerprint(rotation.new[K])}"
    status = {"caRotation": {"certificates": certs}}
    ann = "ichor.maesh.dev/credentials-handoff"
    assert acknowledged({"metadata": {"annotations": {ann: token}}, "status": status})
    assert not acknowledged({"metadata": {"annotations": {ann: token + "x"}}, "status": status})
    assert not acknowledged({"metadata": {}, "status": status})
    assert not acknowledged({"metadata": {"annotations": {ann: ""}}, "status": {}})  # no token before Accepting


def test_replaced_by_recognises_the_new_cas_by_fingerprint(bundle: SecretsBundle, rotation: Rotation) -> None:
    certs = certificates_status(bundle, rotation, Stage.DROPPING)
    assert not replaced_by(bundle, certs)
    assert replaced_by(rotation.apply_to(bundle), certs)
    assert not replaced_by(rotation.apply_to(bundle), [])


def test_dial_credentials_per_stage(bundle: SecretsBundle, rotation: Rotation) -> None:
    both = {bundle.os.cert_pem, rotation.new[T].cert_pem}
    accepting = apply_dial(bundle, rotation, Stage.ACCEPTING)
    assert accepting.signing_ca.cert_pem == bundle.os.cert_pem and set(accepting.trusted_cas) == both
    for stage in (Stage.ISSUING, Stage.DROPPING):
        assert apply_dial(bundle, rotation, stage).signing_ca.cert_pem == rotation.new[T].cert_pem
    # Accepting is verified with the new client certificate: it proves the nodes accept it.
    verify = verify_dial(bundle, rotation, Stage.ACCEPTING)
    assert verify.signing_ca.cert_pem == rotation.new[T].cert_pem and set(verify.trusted_cas) == both
    k8s_only = Rotation({K: rotation.new[K]})
    assert apply_dial(bundle, k8s_only, Stage.ISSUING).signing_ca.cert_pem == bundle.os.cert_pem


@pytest.mark.parametrize(("preset", "want"), [
    ("cilium", ["daemonset/cilium", "deployment/cilium-operator", "daemonset/kube-proxy", "deployment/coredns"]),
    ("flannel", ["daemonset/kube-flannel", "daemonset/kube-proxy", "deployment/coredns"]),
    ("", ["daemonset/kube-flannel", "daemonset/kube-proxy", "deployment/coredns"]),
    ("unmanaged", ["daemonset/kube-proxy", "deployment/coredns"]),
])
def test_restart_sequence_cni_first(preset: str, want: list[str]) -> None:
    assert [str(w) for w in clients.sequence(preset)] == want
    assert clients.cni_restarted(preset) is (preset != "unmanaged")


def _deploy(gen: int, observed: int, replicas: int, updated: int, available: int) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"generation": gen}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                       "availableReplicas": available}}


def _ds(gen: int, observed: int, desired: int, updated: int, available: int) -> dict[str, Any]:
    return {"kind": "DaemonSet", "metadata": {"generation": gen}, "spec": {},
            "status": {"observedGeneration": observed, "desiredNumberScheduled": desired,
                       "updatedNumberScheduled": updated, "numberAvailable": available}}


@pytest.mark.parametrize(("obj", "want"), [
    (_deploy(2, 2, 2, 2, 2), True),
    (_deploy(2, 1, 2, 2, 2), False),  # the controller has not seen the restart yet
    (_deploy(2, 2, 2, 1, 2), False),
    (_deploy(2, 2, 2, 2, 1), False),
    (_ds(3, 3, 4, 4, 4), True),
    (_ds(3, 3, 4, 3, 4), False),
    (_ds(3, 3, 4, 4, 3), False),
    (_ds(3, 2, 4, 4, 4), False),
])
def test_available(obj: dict[str, Any], want: bool) -> None:
    assert clients.available(obj) is want


def test_restart_patch_carries_the_uid() -> None:
    patch = clients.restart_patch("uid-1", "2026-01-01T00:00:00Z")
    ann = patch["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z",
                   CA_ROTATION_TEMPLATE_ANNOTATION: "uid-1"}
    obj = {"spec": {"template": {"metadata": {"annotations": ann}}}}
    assert clients.carries(obj, "uid-1") and not clients.carries(obj, "uid-2")


def test_timed_condition_restarts_its_clock_on_a_new_reason_only() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    status: dict[str, Any] = {}
    set_ca_condition(status, Condition("CARotation", "Unknown", "SettlingNodes", "a"), t0, timed=True)
    t1 = t0 + dt.timedelta(seconds=50)
    set_ca_condition(status, Condition("CARotation", "Unknown", "SettlingNodes", "b"), t1, timed=True)
    assert since_transition(status, "SettlingNodes", t1) == 50.0  # same reason: the clock runs on
    set_ca_condition(status, Condition("CARotation", "Unknown", "AwaitingNodes", "c"), t1, timed=True)
    assert since_transition(status, "SettlingNodes", t1) is None
    t2 = t1 + dt.timedelta(seconds=5)
    set_ca_condition(status, Condition("CARotation", "Unknown", "SettlingNodes", "d"), t2, timed=True)
    assert since_transition(status, "SettlingNodes", t2 + dt.timedelta(seconds=1)) == 1.0  # reset by NotReady
    # Untimed: metav1 semantics (the time moves only with the status).
    set_ca_condition(status, Condition("CARotation", "Unknown", "InProgress", "e"), t2 + dt.timedelta(seconds=9))
    cond = find(status["conditions"], "CARotation")
    assert cond is not None and cond["lastTransitionTime"] == "2026-01-01T00:00:55Z"
