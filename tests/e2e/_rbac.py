"""RBAC rules against recorded requests: what a request needs, what a rule grants, what is left over."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.sim.kube.faults import Access


@dataclass(frozen=True)
class Grant:
    """One verb on one resource (``res/sub``) of one group, optionally one name, from a Role or ClusterRole."""

    scope: str  # "cluster" or the Role's namespace
    group: str
    resource: str
    verb: str
    name: str | None


def grants(rules: Iterable[dict[str, Any]], scope: str) -> set[Grant]:
    out = set()
    for rule in rules:
        names: Sequence[str | None] = rule.get("resourceNames") or [None]
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in names:
                        out.add(Grant(scope, group, resource, verb, name))
    return out


def _resource(access: Access) -> str:
    return f"{access.resource}/{access.subresource}" if access.subresource else access.resource


def allows(grant: Grant, access: Access) -> bool:
    if grant.scope != "cluster" and grant.scope != access.namespace:
        return False
    return (grant.group in (access.group, "*") and grant.resource in (_resource(access), "*")
            and grant.verb in (access.verb, "*") and (grant.name is None or grant.name == access.name))


def compare(granted: set[Grant], accesses: Iterable[Access]) -> tuple[set[Access], set[Grant]]:
    """(requests no grant allows, grants no request used)."""
    accesses = set(accesses)
    missing = {a for a in accesses if not any(allows(g, a) for g in granted)}
    unused = {g for g in granted if not any(allows(g, a) for a in accesses)}
    return missing, unused


def chart_grants(docs: list[dict[str, Any]], service_account: str, namespace: str) -> set[Grant]:
    """What the chart's roles bound to ``service_account`` in ``namespace`` grant."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                   and s.get("namespace") == namespace for s in binding.get("subjects") or []):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        out |= grants(role.get("rules") or [], scope)
    return out


def describe(accesses: Iterable[Access]) -> list[str]:
    return sorted({f"{a.verb} {a.group or 'core'}/{_resource(a)} ns={a.namespace or '-'} name={a.name or '*'}"
                   for a in accesses})
