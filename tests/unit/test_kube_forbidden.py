"""ichord.kube.forbidden: a 403 said as the verb, resource and namespace refused and the chart value granting it."""

from __future__ import annotations

import pytest

from ichord.kube.errors import Forbidden, from_status
from ichord.kube.forbidden import Denial, forbidden_message

SA = "system:serviceaccount:ichord-system:ichord"


def _refusal(subject: str, verb: str, resource: str, group: str, where: str) -> Forbidden:
    """A 403 as kube-apiserver's RBAC filter words it (NewForbidden around forbiddenMessage)."""
    err = from_status(403, {"kind": "Status", "reason": "Forbidden", "code": 403, "message":
                            f'{subject} is forbidden: User "{SA}" cannot {verb} resource "{resource}" in API group '
                            f'"{group}"{where}'})
    assert isinstance(err, Forbidden)
    return err


@pytest.mark.parametrize(("verb", "resource", "group", "namespace", "cluster_ns", "what", "value"), [
    ("get", "secrets", "", "team-a", "team-a", "get secrets in namespace team-a", "watchNamespaces"),
    ("list", "secrets", "", "team-a", None, "list secrets in namespace team-a", "watchNamespaces"),
    ("get", "secrets", "", "vault", "team-a", "get secrets in namespace vault", "controller.allowedSecretNamespaces"),
    ("create", "leases", "coordination.k8s.io", "team-a", "team-a",
     "create leases.coordination.k8s.io in namespace team-a", "watchNamespaces"),
    ("patch", "talosmachines/status", "ichor.maesh.dev", "team-a", None,
     "patch talosmachines/status.ichor.maesh.dev in namespace team-a", "rbac.create"),
    ("create", "events", "", "team-a", None, "create events in namespace team-a", "rbac.create"),
])
def test_a_refusal_names_what_was_refused_and_the_chart_value(verb: str, resource: str, group: str, namespace: str,
                                                               cluster_ns: str | None, what: str, value: str) -> None:
    exc = _refusal(f'{resource.partition("/")[0]} "x"', verb, resource, group, f' in the namespace "{namespace}"')
    denial = Denial.of(exc)
    assert denial == Denial(verb, resource, group, namespace, SA)
    message = forbidden_message(exc, cluster_namespace=cluster_ns)
    assert what in message and f"chart value {value}" in message and "403 Forbidden" in message, message
    if value == "watchNamespaces":
        assert f"add {namespace} to the chart value watchNamespaces" in message


def test_a_cluster_scoped_refusal_and_one_worded_otherwise() -> None:
    scoped = _refusal("talosclusters.ichor.maesh.dev", "list", "talosclusters", "ichor.maesh.dev",
                      " at the cluster scope")
    assert "list talosclusters.ichor.maesh.dev at the cluster scope" in forbidden_message(scoped)
    odd = from_status(403, {"reason": "Forbidden", "message": "admission webhook said no"})
    assert isinstance(odd, Forbidden) and Denial.of(odd) is None
    assert forbidden_message(odd).endswith("admission webhook said no (403 Forbidden)")
    # A resource the chart does not grant: no chart value is invented.
    nodes = _refusal("nodes", "list", "nodes", "", " at the cluster scope")
    assert "chart value" not in forbidden_message(nodes)
