"""ConfigMemo: a hash is given back only for the very content it was computed from, and it stays bounded."""

from __future__ import annotations

from dataclasses import replace

from ichord.machines.memo import ConfigMemo
from ichord.pki.bundle import generate_bundle
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.trusted_cas import NodeTrust

SPEC = {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1"}


def test_render_hash_only_for_equal_inputs() -> None:
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", SPEC)
    machine = MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": "worker"})
    memo = ConfigMemo()
    assert memo.rendered_hash(bundle, cluster, machine) is None
    memo.remember_render(bundle, cluster, machine, "h1")
    # equal content in new objects (the next step's reads, another machine of the same role) is a hit
    assert memo.rendered_hash(replace(bundle), ClusterInputs.from_spec("demo", dict(SPEC)),
                              MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": "worker"})) == "h1"
    # any change is a miss: the cluster's patches or version, the machine's role or patches, the bundle
    assert memo.rendered_hash(bundle, replace(cluster, patches=("machine: {}\n",)), machine) is None
    assert memo.rendered_hash(bundle, replace(cluster, kubernetes_version="1.34.2"), machine) is None
    assert memo.rendered_hash(bundle, cluster, replace(machine, role="controlplane")) is None
    assert memo.rendered_hash(bundle, cluster, replace(machine, patches=("machine: {}\n",))) is None
    assert memo.rendered_hash(generate_bundle(), cluster, machine) is None
    assert memo.rendered_hash(replace(bundle, trustd_token="x.y"), cluster, machine) is None
    # a new render of the same machine inputs replaces the old one
    memo.remember_render(bundle, replace(cluster, kubernetes_version="1.34.2"), machine, "h2")
    assert memo.rendered_hash(bundle, cluster, machine) is None


def _hash(memo: ConfigMemo, running: bytes) -> str | None:
    found = memo.running(running)
    return None if found is None else found[0]


def test_running_hash_only_for_the_same_bytes() -> None:
    memo = ConfigMemo()
    trust = NodeTrust(talos=("aa",), kubernetes=("bb",))
    assert memo.running(b"version: v1alpha1\n") is None
    memo.remember_running(b"version: v1alpha1\n", "h2", trust)
    assert memo.running(b"version: v1alpha1\n") == ("h2", trust)  # the CAs it trusts kept with its hash
    assert memo.running(b"version: v1alpha1\n\n") is None  # one byte differs: parsed again
    assert memo.running(b"") is None


def test_bounded_least_recently_used_first() -> None:
    memo = ConfigMemo(limit=2)
    for i in range(3):
        memo.remember_running(f"c{i}".encode(), f"h{i}", NodeTrust())
    assert _hash(memo, b"c0") is None and _hash(memo, b"c2") == "h2"
    assert _hash(memo, b"c1") == "h1"  # used: now the most recent
    memo.remember_running(b"c3", "h3", NodeTrust())
    assert _hash(memo, b"c2") is None and _hash(memo, b"c1") == "h1"
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", SPEC)
    for role in ("worker", "controlplane"):
        memo.remember_render(bundle, cluster, MachineInputs(role=role), role)  # type: ignore[arg-type]
    memo.bound(1)  # the cluster lost machines
    assert len(memo) == 2
    assert memo.rendered_hash(bundle, cluster, MachineInputs(role="controlplane")) == "controlplane"
    assert memo.rendered_hash(bundle, cluster, MachineInputs(role="worker")) is None


def test_repr_holds_no_bundle() -> None:
    memo = ConfigMemo()
    bundle = generate_bundle()
    memo.remember_render(bundle, ClusterInputs.from_spec("demo", SPEC), MachineInputs(), "h")
    assert bundle.cluster_secret not in repr(memo) and bundle.trustd_token not in repr(memo)


def test_bundle_digest_sees_every_field() -> None:
    from ichord.machines.memo import bundle_digest
    from ichord.pki.ca import CertificateAuthority

    bundle = generate_bundle()
    assert bundle_digest(bundle) == bundle_digest(replace(bundle))
    other_ca = CertificateAuthority(bundle.os.cert_pem, None)  # the same certificate without its key
    aescbc = None if bundle.aescbc_encryption_secret else "x"
    changed = [replace(bundle, cluster_id="x"), replace(bundle, aescbc_encryption_secret=aescbc),
               replace(bundle, secretbox_encryption_secret=(bundle.secretbox_encryption_secret or "") + "x"),
               replace(bundle, os=other_ca), replace(bundle, k8s_service_account_key=b"x"),
               replace(bundle, etcd=bundle.k8s)]
    digests = {bundle_digest(b) for b in changed}
    assert bundle_digest(bundle) not in digests and len(digests) == len(changed)


def test_classification_only_for_the_same_bytes_render_contract_and_role() -> None:
    from ichord.contract import V1_14
    from ichord.render.fieldmeta import Classification

    memo = ConfigMemo(limit=1)
    result = Classification(V1_14, "worker", ())
    memo.remember_classification(b"version: v1alpha1\n", "r1", "v1.14", "worker", result)
    assert memo.classification(b"version: v1alpha1\n", "r1", "v1.14", "worker") is result
    assert memo.classification(b"version: v1alpha1\n\n", "r1", "v1.14", "worker") is None  # the node changed
    assert memo.classification(b"version: v1alpha1\n", "r2", "v1.14", "worker") is None  # the render changed
    assert memo.classification(b"version: v1alpha1\n", "r1", "v1.13", "worker") is None
    assert memo.classification(b"version: v1alpha1\n", "r1", "v1.14", "controlplane") is None
    memo.remember_classification(b"other", "r1", "v1.14", "worker", result)  # bounded: the older one goes
    assert memo.classification(b"version: v1alpha1\n", "r1", "v1.14", "worker") is None
