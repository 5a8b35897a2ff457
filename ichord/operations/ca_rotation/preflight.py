"""Preflight (stage empty): nothing is written, not even a CA, unless the cluster is whole
(docs/decisions.md#rotation-state).

Every approved machine answers ichord, runs exactly what ichord renders for it (managed/rendered.py: no unrelated
pending change is swept into the rotation), and every Kubernetes Node is Ready; an etcd rotation also needs
etcd whole (managed/etcd_health.py). A machine that is down when
the old CA is dropped could never be reached again.
"""

from __future__ import annotations

from collections.abc import Iterable

from ichord.api.views import MachineView
from ichord.operations.ca_rotation.managed_objects import not_ready_nodes
from ichord.operations.ca_rotation.plan import contract_refusal, spec_targets
from ichord.operations.managed.clients import ManagedAPIError, admin_client
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.etcd_health import etcd_problems
from ichord.operations.managed.inputs import Inputs
from ichord.operations.managed.rendered import Mismatch, divergence
from ichord.pki.rotation import Target
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

CONVERGE = "let it converge before rotating"


def way_out(inputs: Inputs) -> str:
    """What to do when a machine's difference waits for a reboot: ``config-apply`` is refused while this rotation
    exists, so the order is named (a rotation that has not started is abandoned with nothing to undo)."""
    ns, cluster, name = inputs.op_namespace, inputs.cluster_name, inputs.name
    return (f"a change that waits for a reboot or a kube-apiserver restart (the machine's status.rebootPaths) is "
            f"rolled out by `ichord cluster config-apply {cluster} -n {ns}`, which is refused while this rotation "
            f"exists: delete it first (`kubectl -n {ns} delete talosoperation {name}`; it has not started, nothing "
            "is undone), roll the change out, then rotate again")


async def _machine_problem(talos: TalosClient, inputs: Inputs, m: MachineView) -> str | None:
    found = await divergence(talos, inputs, m)
    if found is None:
        return None
    if found.mismatch is Mismatch.UNRENDERABLE:
        return f"machine {m.name} cannot be rendered: {found.detail}"
    if found.mismatch is Mismatch.DIFFERENT:
        return f"machine {m.name} does not run the configuration ichord renders for it; {CONVERGE}"
    return f"machine {m.name} ({m.address}) does not answer: {found.detail}"


async def preflight(ctx: StepContext, inputs: Inputs, targets: Iterable[Target] = ()) -> list[str]:
    """The reasons the rotation may not start (empty: it may)."""
    if not inputs.machines:
        return [f"cluster {inputs.cluster_name} has no approved machine"]
    if not inputs.control_planes:
        return [f"cluster {inputs.cluster_name} has no approved control plane"]
    refusal = contract_refusal(spec_targets(inputs.op), inputs.cluster_inputs.contract)
    if refusal is not None:  # the contract changed since the plan was written
        return [refusal]
    problems: list[str] = []
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        for m in inputs.machines:
            problem = await _machine_problem(talos, inputs, m)
            if problem:
                problems.append(problem)
        if any(p.endswith(CONVERGE) for p in problems):
            problems.append(way_out(inputs))
        if problems:
            return problems
        try:
            async with admin_client(talos, inputs.control_planes, [inputs.bundle.k8s.cert_pem]) as kc:
                not_ready = await not_ready_nodes(kc)
        except ManagedAPIError as exc:
            return [str(exc)]
        if not_ready:
            problems.append(f"Node(s) not Ready: {', '.join(not_ready)}")
        if Target.ETCD in targets and not problems:
            # docs/decisions.md#ca-rotation-passes: an etcd rotation starts only on a whole etcd.
            problems += [p.text for p in await etcd_problems(talos, inputs.control_planes)]
        return problems
    finally:
        talos.close()
