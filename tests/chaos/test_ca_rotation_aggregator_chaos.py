"""The chaos tier for the aggregator (front-proxy) CA (docs/decisions.md#aggregator-ca): ``ichord run`` rotating it
alone on a simulated 3+1 cluster, killed at every failpoint such a rotation passes, in turn, and restarted each time.

Checked from the simulators, not from ichord's status: the operation completes; each control plane got exactly one
apply per pass and no worker any (none repeated after a kill); no two kube-apiservers were ever restarting at once;
every control plane's kube-apiserver runs, ready, on the new aggregator CA; extension-apiserver-authentication
holds the new front-proxy CA alone; the bundle Secret holds it; and _chaos.common_invariants (no rotation.yaml,
cordon or lock left, no key material in any log, status or Event).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.sim.combined import SimEnvironment
from tests.chaos._chaos import common_invariants, kill_at_each_failpoint
from tests.e2e._daemon import Daemon
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_ca_rotation_aggregator_daemon import _apiservers_on, _ext_auth, _follow, _secret
from tests.integration._apiserver_history import overlapping_restarts

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]

#: Every failpoint an aggregator-only rotation passes, in order: no hand-off (the Talos CA stays), no client
#: restarts (the Kubernetes CA stays), and Finalizing's AggregatorAuthReset deletes the ConfigMap that still lists
#: the old front-proxy CA. The default rotation's list is in test_ca_rotation_chaos.py.
FAILPOINTS = [
    "ca-rotation.save.before", "ca-rotation.saved",
    "ca-rotation.apiserver.recorded",
    "ca-rotation.apply.before.accepting", "ca-rotation.apply.after.accepting",
    "ca-rotation.apply.before.issuing", "ca-rotation.apply.after.issuing",
    "ca-rotation.apply.before.dropping", "ca-rotation.apply.after.dropping",
    "ca-rotation.replace.before", "ca-rotation.replace.after",
    "ca-rotation.aggregator.delete.before", "ca-rotation.aggregator.delete.after",
    "ca-rotation.done.before",
]


@pytest.fixture
async def aggregator_env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="separate")


async def test_killed_at_every_failpoint_in_turn_the_aggregator_rotation_completes(
        aggregator_env: SimEnvironment, tmp_path: Path) -> None:
    env = aggregator_env
    old = env.bundle
    assert old is not None
    async with await from_kubeconfig(env.kubeconfig) as kube:
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation",
            "caRotation": {"targets": ["kubernetes-aggregator"]}}})
        seen: list[str] = []
        daemons = await kill_at_each_failpoint(
            env, tmp_path, FAILPOINTS, lambda d: _follow(kube, env, seen, stop=lambda _op: d.proc.poll() is not None))
        last = Daemon(env, tmp_path, "fp-last")
        daemons.append(last)
        try:
            with anyio.fail_after(120):
                await _follow(kube, env, seen)
            new = SecretsBundle.from_yaml(_secret(env)[names.SECRETS_KEY])
            assert new.k8s_aggregator.cert_pem != old.k8s_aggregator.cert_pem
            assert (new.os.cert_pem, new.k8s.cert_pem) == (old.os.cert_pem, old.k8s.cert_pem)
            for m in env.machine_names:  # one apply per pass on a control plane, none repeated after any kill
                want = 3 if env.node(m).is_control_plane else 0
                assert len(env.applies(m)) == want, (m, env.applies(m))
            assert overlapping_restarts(env.talos.history.events) == []
            assert _apiservers_on(env, new) == []
            assert _ext_auth(env) == _pem.pem_blocks(new.k8s_aggregator.cert_pem)  # the new CA alone
            # Completed, no rotation.yaml, no cordon, the lock and finalizer released, no key in any log, status or
            # Event: the invariants every operation's chaos test shares.
            await common_invariants(env, "rotate", daemons, [old, new])
        finally:
            assert await last.stop() == 0
