"""A 403 from the management API, said as what was refused and which chart value grants it.

kube-apiserver's RBAC refusal names the verb, the resource (with its subresource) and the namespace in a fixed
form (``forbiddenMessage`` in k8s.io/apiserver's authorization filter)::

    secrets "demo" is forbidden: User "system:serviceaccount:ichord-system:ichord" cannot get resource
    "secrets" in API group "" in the namespace "team-a"

``Denial.of`` reads those back, and ``Denial.message`` says them with the chart value that grants the request
(helm/ichord/values.yaml), so the condition a 403 becomes tells the operator what to change. The table of chart
values is here, beside the parser, because it is the chart's RBAC said in the daemon's words: a change to
templates/role.yaml or clusterrole.yaml changes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ichord.kube.errors import Forbidden

_REFUSAL = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)" in API group "(?P<group>[^"]*)"'
    r'(?: in the namespace "(?P<namespace>[^"]+)"| at the cluster scope)')

#: Namespaced resources the chart grants per namespace ichord serves (templates/role.yaml).
SERVED_NAMESPACE_VALUE = "watchNamespaces"
#: What grants a bundle Secret a TalosCluster of another namespace names (templates/role.yaml, the -bundles Role).
CROSS_NAMESPACE_SECRET_VALUE = "controller.allowedSecretNamespaces"  # noqa: S105 - a chart value's name
#: The chart's ClusterRole (templates/clusterrole.yaml): ichord's own kinds and Events, in every namespace.
CLUSTER_ROLE_VALUE = "rbac.create"

_PER_NAMESPACE = {"secrets", "leases"}
_CLUSTER_ROLE = {"talosclusters", "talosmachines", "talosoperations", "talosclusters/status",
                 "talosmachines/status", "talosoperations/status", "events"}


@dataclass(frozen=True)
class Denial:
    """One refused request: ``namespace`` is empty for a cluster-scoped one."""

    verb: str
    resource: str
    group: str
    namespace: str
    user: str = ""

    @classmethod
    def of(cls, exc: Forbidden) -> Denial | None:
        """The refusal named in a 403's message, or None when the server said it another way."""
        found = _REFUSAL.search(str(exc))
        if found is None:
            return None
        return cls(found["verb"], found["resource"], found["group"], found["namespace"] or "", found["user"])

    @property
    def what(self) -> str:
        where = f"in namespace {self.namespace}" if self.namespace else "at the cluster scope"
        group = f".{self.group}" if self.group else ""
        return f"{self.verb} {self.resource}{group} {where}"

    def grant(self, *, cluster_namespace: str | None = None) -> str | None:
        """The chart value that grants this request (None: nothing in the chart does)."""
        if self.resource in _PER_NAMESPACE:
            if self.resource == "secrets" and cluster_namespace and self.namespace != cluster_namespace:
                return CROSS_NAMESPACE_SECRET_VALUE
            return SERVED_NAMESPACE_VALUE
        if self.resource in _CLUSTER_ROLE:
            return CLUSTER_ROLE_VALUE
        return None

    def message(self, *, cluster_namespace: str | None = None) -> str:
        who = f" {self.user}" if self.user else ""
        text = f"the management API refused to let{who} {self.what} (403 Forbidden)"
        value = self.grant(cluster_namespace=cluster_namespace)
        if value == SERVED_NAMESPACE_VALUE:
            return (f"{text}; the chart grants {self.resource} only in the namespaces ichord serves: add "
                    f"{self.namespace} to the chart value {value} (or set watchAllNamespaces: true) and helm upgrade")
        if value == CROSS_NAMESPACE_SECRET_VALUE:
            return (f"{text}; a bundle Secret outside the TalosCluster's namespace is granted by the chart value "
                    f"{value}: add {self.namespace} to it and helm upgrade")
        if value == CLUSTER_ROLE_VALUE:
            return (f"{text}; the chart's ClusterRole grants it (chart value {value}: true); restore the rule, or "
                    f"grant it to the service account by hand when rbac.create is false")
        return f"{text}; grant it to the identity ichord runs as"


def forbidden_message(exc: Forbidden, *, cluster_namespace: str | None = None) -> str:
    """What a condition or Event says of a 403: the refusal and its chart value, else the server's own words."""
    denial = Denial.of(exc)
    if denial is None:
        return f"the management API refused a request (403 Forbidden): {exc}"
    return denial.message(cluster_namespace=cluster_namespace)
