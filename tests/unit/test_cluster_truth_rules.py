"""Issue 39's pure rules (docs/decisions.md#bundle-belongs): the CAs a node's configuration trusts, read for both
contracts and every rotation stage; when a bundle is one of them; and the TalosCluster's Ready from its machines,
row by row."""

from __future__ import annotations

import pytest

from ichord.actors.cluster_ready import READY, MachineReady, cluster_ready
from ichord.api.carotation import Stage
from ichord.contract import SUPPORTED_CONTRACTS, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Target, generate_rotation
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage
from ichord.render.trusted_cas import BundleCAs, NodeTrust, refusals


@pytest.fixture(scope="module")
def bundles() -> tuple[SecretsBundle, SecretsBundle]:
    return generate_bundle(), generate_bundle()


def _inputs(contract: VersionContract) -> ClusterInputs:
    return ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1",
                                            "talosVersion": str(contract)})


@pytest.mark.parametrize("contract", SUPPORTED_CONTRACTS, ids=str)
@pytest.mark.parametrize("role", ["controlplane", "worker"])
def test_a_render_trusts_its_bundle_and_refuses_another(bundles: tuple[SecretsBundle, SecretsBundle],
                                                        contract: VersionContract, role: str) -> None:
    own, other = bundles
    trust = NodeTrust.of_config(render(own, _inputs(contract), MachineInputs(role=role)).plain())  # type: ignore[arg-type]
    cp = role == "controlplane"
    # A control plane carries the etcd and the aggregator CAs too; a worker neither (Talos gives it neither).
    assert trust == NodeTrust((ca_fingerprint(own.os),), (ca_fingerprint(own.k8s),),
                              (ca_fingerprint(own.etcd),) if cp else (),
                              (ca_fingerprint(own.k8s_aggregator),) if cp else ())
    assert refusals(BundleCAs.of_bundle(own), trust) == ()
    refused = refusals(BundleCAs.of_bundle(other), trust)
    expected = [("talos", ca_fingerprint(other.os), (ca_fingerprint(own.os),)),
                ("kubernetes", ca_fingerprint(other.k8s), (ca_fingerprint(own.k8s),))]
    if cp:
        expected += [("etcd", ca_fingerprint(other.etcd), (ca_fingerprint(own.etcd),)),
                     ("kubernetes-aggregator", ca_fingerprint(other.k8s_aggregator),
                      (ca_fingerprint(own.k8s_aggregator),))]
    assert [(r.name, r.bundle, r.node) for r in refused] == expected
    assert NodeTrust.from_status(trust.as_status()) == trust  # what status.trustedCAs keeps reads back the same
    if cp:  # a control plane's render hands it exactly the bundle's four CAs
        assert BundleCAs.of_render(trust) == BundleCAs.of_bundle(own)


@pytest.mark.parametrize("contract", SUPPORTED_CONTRACTS, ids=str)
@pytest.mark.parametrize("swapped", [CAKind.ETCD, CAKind.AGGREGATOR])
def test_only_the_etcd_or_the_aggregator_ca_swapped_is_refused_on_control_planes_alone(
        bundles: tuple[SecretsBundle, SecretsBundle], contract: VersionContract, swapped: CAKind) -> None:
    own, other = bundles
    foreign = own.with_cas({swapped: other.ca(swapped)})
    name = "etcd" if swapped is CAKind.ETCD else "kubernetes-aggregator"
    for role in ("controlplane", "worker"):
        trust = NodeTrust.of_config(render(own, _inputs(contract), MachineInputs(role=role)).plain())  # type: ignore[arg-type]
        refused = refusals(BundleCAs.of_bundle(foreign), trust)
        if role == "worker":
            assert refused == ()  # a worker carries neither CA: it is not judged on them
            continue
        assert [(r.name, r.bundle, r.node) for r in refused] == [
            (name, ca_fingerprint(other.ca(swapped)), (ca_fingerprint(own.ca(swapped)),))]


def test_a_record_of_an_older_ichord_reads_without_the_new_cas() -> None:
    assert NodeTrust.from_status({"talos": ["a"], "kubernetes": ["b"]}) == NodeTrust(("a",), ("b",))


@pytest.mark.parametrize("stage", [Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING, Stage.FINALIZING])
@pytest.mark.parametrize("role", ["controlplane", "worker"])
def test_a_rotation_stage_trusts_the_bundle_with_its_rotation(bundles: tuple[SecretsBundle, SecretsBundle],
                                                              stage: Stage, role: str) -> None:
    own, _ = bundles
    rotation = generate_rotation((Target.TALOS, Target.KUBERNETES, Target.ETCD, Target.KUBERNETES_AGGREGATOR))
    config = render_stage(own, rotation, stage, _inputs(SUPPORTED_CONTRACTS[-1]), MachineInputs(role=role))  # type: ignore[arg-type]
    trust = NodeTrust.of_config(config.plain())
    new = {t.value: ca.cert_pem for t, ca in rotation.new.items()}
    assert refusals(BundleCAs.of_bundle(own, new), trust) == ()
    # What a pass hands the node is what it trusts at that stage: never refused against the node before the pass.
    assert refusals(BundleCAs.of_render(trust), trust) == ()
    if role == "controlplane" and stage in (Stage.ACCEPTING, Stage.ISSUING):  # old and new both trusted, etcd too
        assert len(trust.etcd) == 2 and len(trust.aggregator) == 2, trust
    # Dropping and Finalizing trust the new CAs alone: secrets.yaml's old ones would be refused without rotation.yaml.
    alone = refusals(BundleCAs.of_bundle(own), trust)
    assert bool(alone) is (stage in (Stage.DROPPING, Stage.FINALIZING))


def test_a_node_that_names_no_ca_is_not_judged() -> None:
    assert refusals(BundleCAs(("a",), ("b",)), NodeTrust()) == ()
    assert NodeTrust.from_status({"talos": "not a list"}) is None
    assert NodeTrust.from_status(None) is None


KW = {"namespace": "ns", "secret": "Secret ns/demo-secrets", "restore": "`kubectl apply`"}
CAS = BundleCAs(("b" * 64,), ("c" * 64,))


def ready(*machines: MachineReady) -> tuple[str, str, str]:
    cond = cluster_ready(machines, CAS, **KW)
    return cond.status, cond.reason, cond.message


def test_machines_ready_or_in_a_planned_wait_make_the_cluster_ready() -> None:
    assert cluster_ready([MachineReady("cp-1", "True", "Converged"), MachineReady("w-1", "True", "Applied")],
                         CAS, **KW) == READY
    planned = [MachineReady("cp-1", "False", "Rebooting"), MachineReady("cp-2", "False", "APIServerRestarting"),
               MachineReady("cp-3", "Unknown", "CARotationInProgress"), MachineReady("w-1", "Unknown",
                                                                                     "OperationUnderWay"),
               MachineReady("w-2", None)]  # not reconciled yet: counts for nothing either way
    assert cluster_ready(planned, CAS, **KW) == READY
    assert cluster_ready([], CAS, **KW) == READY


def test_any_reason_not_ready_is_counted_and_named_bounded() -> None:
    status, reason, message = ready(MachineReady("w-1", "False", "InvalidConfig"),
                                    MachineReady("cp-1", "True", "Converged"),
                                    MachineReady("cp-2", "False", "Unreachable"),
                                    MachineReady("w-2", "False", "ContractMismatch"),  # a reason this code never knew
                                    MachineReady("w-3", "Unknown", "ApplyFailed"),
                                    MachineReady("w-4", "False", "AddressInUse"))
    assert (status, reason) == ("False", "MachinesNotReady")
    assert message.startswith("5 of 6 machines not Ready: w-1 InvalidConfig, cp-2 Unreachable, w-2 ContractMismatch "
                              "and 2 more; each machine's Ready says why: `kubectl -n ns get tm`"), message


def test_a_machine_refusing_the_bundle_makes_it_a_mismatch_naming_both_fingerprints() -> None:
    node = NodeTrust(("a" * 64,), ("c" * 64,))
    status, reason, message = ready(MachineReady("cp-1", "False", "BundleMismatch", node),
                                    MachineReady("w-1", "False", "Unreachable"))
    assert (status, reason) == ("False", "BundleMismatch")
    assert f"its Talos API CA {'b' * 64} is not among the CAs the nodes trust ({'a' * 64})" in message
    assert "Kubernetes CA" not in message  # the nodes trust the bundle's Kubernetes CA: not named
    assert "1 of 2 machines refuse it (cp-1)" in message and message.endswith("`kubectl apply`")
