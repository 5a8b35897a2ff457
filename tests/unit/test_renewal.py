"""The renewal policy's pure parts (ichord/operations/renewal.py): durations, the policy, the schedule, the name."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from ichord.api import names
from ichord.api.views import ClusterView, OperationView
from ichord.contract import parse_contract
from ichord.operations.renewal import (
    DueCA,
    Policy,
    RenewalPolicyError,
    decide,
    operation_name,
    parse_duration,
    schedule,
)
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.pki.rotation import Target

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
#: The CRD's pattern for renewBefore, as the chart ships it.
CRD_PATTERN = r"^([1-9][0-9]*[dhms])+$"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    """talos expires on NOW + 20 days, kubernetes on NOW + 40 days, etcd and the aggregator in ten years."""
    base = generate_bundle()
    return base.with_cas({
        CAKind.OS: generate_ca(CAKind.OS, now=NOW - CA_VALIDITY + dt.timedelta(days=20)),
        CAKind.KUBERNETES: generate_ca(CAKind.KUBERNETES, now=NOW - CA_VALIDITY + dt.timedelta(days=40)),
        CAKind.ETCD: generate_ca(CAKind.ETCD, now=NOW),
        CAKind.AGGREGATOR: generate_ca(CAKind.AGGREGATOR, now=NOW)})


@pytest.mark.parametrize(("text", "want"), [
    ("30d", dt.timedelta(days=30)), ("720h", dt.timedelta(hours=720)), ("1d12h", dt.timedelta(hours=36)),
    ("90s", dt.timedelta(seconds=90)), ("5m30s", dt.timedelta(minutes=5, seconds=30)),
])
def test_durations(text: str, want: dt.timedelta) -> None:
    assert parse_duration(text) == want
    assert re.match(CRD_PATTERN, text)


@pytest.mark.parametrize("text", ["", "30", "0d", "30 days", "1.5h", "-1d", "30ms", "d", "30D", "01d"])
def test_bad_durations_are_refused_as_the_crd_refuses_them(text: str) -> None:
    with pytest.raises(RenewalPolicyError, match="not a duration"):
        parse_duration(text)
    assert re.match(CRD_PATTERN, text) is None


def test_policy_per_target_overrides_the_default() -> None:
    assert Policy.from_spec({}) is None
    assert Policy.from_spec({"caRotation": {"approval": "Automatic"}}) is None
    policy = Policy.from_spec({"caRotation": {"renewBefore": "30d", "renewBeforeByTarget": {"etcd": "60d"}}})
    assert policy is not None and policy.approval == "Manual"
    assert {t: p for t, (p, _) in policy.periods.items()} == {
        Target.TALOS: dt.timedelta(days=30), Target.KUBERNETES: dt.timedelta(days=30),
        Target.ETCD: dt.timedelta(days=60), Target.KUBERNETES_AGGREGATOR: dt.timedelta(days=30)}
    only = Policy.from_spec({"caRotation": {"renewBeforeByTarget": {"etcd": "60d"}}})
    assert only is not None and list(only.periods) == [Target.ETCD]


@pytest.mark.parametrize(("section", "message"), [
    ({"renewBefore": "3650d"}, "spec.caRotation.renewBefore 3650d is not shorter than a new CA's lifetime"),
    ({"renewBefore": "30d", "renewBeforeByTarget": {"talos": "87600h"}},
     "spec.caRotation.renewBeforeByTarget.talos 87600h is not shorter"),
    ({"renewBefore": "thirty"}, "spec.caRotation.renewBefore: 'thirty' is not a duration"),
    ({"renewBeforeByTarget": {"os": "30d"}}, "renewBeforeByTarget names no CA target: os"),
    ({"renewBefore": "30d", "approval": "Later"}, "approval 'Later' is neither Manual nor Automatic"),
])
def test_policies_no_one_can_follow_are_refused(section: dict[str, object], message: str) -> None:
    with pytest.raises(RenewalPolicyError) as refused:
        Policy.from_spec({"caRotation": section})
    assert message in str(refused.value)


def test_the_schedule_names_what_is_due_and_what_comes_next(bundle: SecretsBundle) -> None:
    policy = Policy.from_spec({"caRotation": {"renewBefore": "30d"}})
    assert policy is not None
    plan = schedule(bundle, policy, NOW, parse_contract("v1.14"))
    assert [d.target for d in plan.due] == [Target.TALOS]
    assert plan.next_due is not None
    entry, starts = plan.next_due
    assert entry.target == Target.KUBERNETES and starts == bundle.k8s.not_after - dt.timedelta(days=30)
    # Ten days later kubernetes is due too.
    later = schedule(bundle, policy, NOW + dt.timedelta(days=10, seconds=1), parse_contract("v1.14"))
    assert [d.target for d in later.due] == [Target.TALOS, Target.KUBERNETES]
    # v1.13 cannot rotate the aggregator: left out, and said.
    aggregator = Policy.from_spec({"caRotation": {"renewBeforeByTarget": {"kubernetes-aggregator": "3649d"}}})
    assert aggregator is not None
    old = schedule(bundle, aggregator, NOW + dt.timedelta(days=2), parse_contract("v1.13"))
    assert old.due == () and old.left_out == (Target.KUBERNETES_AGGREGATOR,)
    new = schedule(bundle, aggregator, NOW + dt.timedelta(days=2), parse_contract("v1.14"))
    assert [d.target for d in new.due] == [Target.KUBERNETES_AGGREGATOR]


def _due(target: Target, fingerprint: str) -> DueCA:
    return DueCA(target, NOW, fingerprint, "30d")


def test_the_name_is_the_cluster_the_targets_and_the_fingerprints() -> None:
    a = operation_name("prod", [_due(Target.TALOS, "aa")])
    assert a == operation_name("prod", [_due(Target.TALOS, "aa")])
    assert re.fullmatch(r"prod-renew-[0-9a-f]{10}", a)
    assert a != operation_name("prod", [_due(Target.TALOS, "bb")])  # the next period's CA
    assert a != operation_name("prod", [_due(Target.TALOS, "aa"), _due(Target.KUBERNETES, "cc")])
    assert a != operation_name("prod2", [_due(Target.TALOS, "aa")])
    long = operation_name("x" * 45 + ".-y", [_due(Target.ETCD, "aa")])  # cut at the dot: never "x.-renew"
    assert len(long) <= 63 and re.fullmatch(r"x{45}-renew-[0-9a-f]{10}", long), long


def _cluster() -> ClusterView:
    return ClusterView.of({"metadata": {"namespace": "ns", "name": "prod", "uid": "u1", "generation": 1},
                           "spec": {"caRotation": {"renewBefore": "30d"}}})


def _op(name: str, kind: str = "ca-rotation", *, targets: list[str] | None = None, paused: bool = False,
        phase: str = "", stage: str = "") -> OperationView:
    spec: dict[str, object] = {"clusterRef": {"name": "prod"}, "kind": kind, "paused": paused}
    if targets:
        spec["caRotation"] = {"targets": targets}
    status: dict[str, object] = {"phase": phase} if phase else {}
    if stage:
        status["caRotation"] = {"stage": stage}
    return OperationView.of({"metadata": {"namespace": "ns", "name": name, "uid": name}, "spec": spec,
                             "status": status})


def test_decisions(bundle: SecretsBundle) -> None:
    policy = Policy.from_spec({"caRotation": {"renewBefore": "30d"}})
    assert policy is not None
    plan = schedule(bundle, policy, NOW, parse_contract("v1.14"))
    own = operation_name("prod", plan.due)

    fresh = decide(_cluster(), policy, plan, [], NOW)
    assert fresh.create is not None and fresh.create["metadata"]["name"] == own and fresh.planned == own
    assert fresh.create["spec"] == {"clusterRef": {"name": "prod"}, "kind": "ca-rotation", "paused": True,
                                    "caRotation": {"targets": ["talos"]}}
    assert fresh.condition is not None and fresh.condition.reason == names.RotationDueReason.AWAITING_APPROVAL

    automatic = Policy(policy.periods, "Automatic")
    started = decide(_cluster(), automatic, plan, [], NOW)
    assert started.create is not None and started.create["spec"]["paused"] is False
    assert started.condition is not None and started.condition.reason == names.RotationDueReason.ROTATION_UNDER_WAY

    # A config rollout unfinished: nothing created, and said.
    waiting = decide(_cluster(), policy, plan, [_op("roll", "config", phase="InProgress")], NOW)
    assert waiting.create is None and waiting.condition is not None
    assert waiting.condition.reason == names.RotationDueReason.WAITING_FOR_OPERATION
    assert "ns/roll" in waiting.condition.message
    # A person's paused rotation of the default pair covers talos: it is the one named.
    theirs = decide(_cluster(), policy, plan, [_op("mine", paused=True, phase="Pending")], NOW)
    assert theirs.create is None and theirs.condition is not None
    assert theirs.condition.reason == names.RotationDueReason.AWAITING_APPROVAL
    assert "ns/mine" in theirs.condition.message
    # A rotation of etcd only does not cover talos: wait for it.
    etcd = decide(_cluster(), policy, plan, [_op("etcd", targets=["etcd"], stage="Accepting", phase="InProgress")],
                  NOW)
    assert etcd.create is None and etcd.condition is not None
    assert etcd.condition.reason == names.RotationDueReason.WAITING_FOR_OPERATION
    # A rotation that failed mid-way still holds the cluster (its nodes may run a mixed state).
    failed = decide(_cluster(), policy, plan, [_op("broken", stage="Issuing", phase="Failed")], NOW)
    assert failed.create is None and failed.condition is not None
    assert failed.condition.reason == names.RotationDueReason.WAITING_FOR_OPERATION
    # Finished operations of others are history: the rotation is planned.
    done = decide(_cluster(), policy, plan, [_op("old", stage="Done", phase="Completed")], NOW)
    assert done.create is not None
    # The planned one, failed: not planned twice.
    again = decide(_cluster(), policy, plan, [_op(own, targets=["talos"], phase="Failed")], NOW)
    assert again.create is None and again.condition is not None
    assert again.condition.reason == names.RotationDueReason.ROTATION_FAILED

    nothing = decide(_cluster(), policy, schedule(bundle, policy, NOW - dt.timedelta(days=30), None), [], NOW)
    assert nothing.create is None and nothing.condition is not None
    assert (nothing.condition.status, nothing.condition.reason) == ("False", names.RotationDueReason.NOT_DUE)
    assert "the next is talos" in nothing.condition.message
