"""MachineMemo: a hash is given back only for the very content it was computed from."""

from __future__ import annotations

from dataclasses import replace

from ichord.machines.memo import MachineMemo
from ichord.pki.bundle import generate_bundle
from ichord.render.inputs import ClusterInputs, MachineInputs


def test_render_hash_only_for_equal_inputs() -> None:
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1"})
    machine = MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": "worker"})
    memo = MachineMemo()
    assert memo.rendered_hash((bundle, cluster, machine)) is None
    memo.remember_render((bundle, cluster, machine), "h1")
    # equal content in new objects (the next step's reads) is a hit
    again = (replace(bundle), ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443",
                                                               "kubernetesVersion": "1.34.1"}),
             MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": "worker"}))
    assert memo.rendered_hash(again) == "h1"
    # any change is a miss: the cluster's patches, the machine's role, the bundle
    assert memo.rendered_hash((bundle, replace(cluster, patches=("machine: {}\n",)), machine)) is None
    assert memo.rendered_hash((bundle, cluster, replace(machine, role="controlplane"))) is None
    assert memo.rendered_hash((bundle, replace(cluster, kubernetes_version="1.34.2"), machine)) is None
    assert memo.rendered_hash((generate_bundle(), cluster, machine)) is None
    assert memo.rendered_hash((replace(bundle, trustd_token="x.y"), cluster, machine)) is None


def test_running_hash_only_for_the_same_bytes() -> None:
    memo = MachineMemo()
    assert memo.running_hash(b"version: v1alpha1\n") is None
    memo.remember_running(b"version: v1alpha1\n", "h2")
    assert memo.running_hash(b"version: v1alpha1\n") == "h2"
    assert memo.running_hash(b"version: v1alpha1\n\n") is None  # one byte differs: parsed again
    assert memo.running_hash(b"") is None
    memo.forget()
    assert memo.running_hash(b"version: v1alpha1\n") is None


def test_repr_holds_no_bundle() -> None:
    memo = MachineMemo()
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1"})
    memo.remember_render((bundle, cluster, MachineInputs()), "h")
    assert bundle.cluster_secret not in repr(memo)
