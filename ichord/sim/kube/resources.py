"""The resource types the simulator serves: built-ins and CRD-defined custom resources.

No admission plugin runs here, ValidatingAdmissionPolicy included, and admissionregistration.k8s.io is not
served: a policy sent to the simulator is refused (404 NotFound, as by an API server without that API), never
stored and silently left unenforced. The simulator therefore answers as kube-apiserver does without the chart's
policy (helm/ichord/templates/validatingadmissionpolicy.yaml): a TalosOperation's spec changed after its start is
accepted, and ichord itself keeps the accepted intent (ichord/operations/intent.py). Implementing CEL admission
here would be a second CEL engine to keep equal to the real one; the real tier proves the policy on kube-apiserver
(tests/real/test_operation_intent_real.py) and tests/integration/test_operation_intent.py pins the 404."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" is the core group
    version: str
    kind: str
    plural: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    #: metadata.generation is kept (bumped on spec changes only).
    generation: bool = False
    #: A CRD-defined type: structural schema, no strategic merge, status dropped on create.
    custom: bool = False
    schema: JSON | None = field(default=None, compare=False, hash=False)
    printer_columns: tuple[JSON, ...] = field(default=(), compare=False, hash=False)
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``plural.group`` as the API server names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def returns_deleted_object(self) -> bool:
        # The registry returns the object for pods, namespaces and custom resources, a Status otherwise.
        return self.custom or self.plural in ("pods", "namespaces")

    def discovery(self) -> list[JSON]:
        """The APIResource entries of this type (itself and its subresources)."""
        main: JSON = {
            "name": self.plural, "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced, "kind": self.kind, "verbs": list(_ALL_VERBS),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        out = [main]
        for sub in sorted(self.subresources):
            verbs = ["create"] if sub == "eviction" else ["get", "patch", "update"]
            kind = "Eviction" if sub == "eviction" else self.kind
            entry: JSON = {"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                           "kind": kind, "verbs": verbs}
            if sub == "eviction":
                entry["group"], entry["version"] = "policy", "v1"
            out.append(entry)
        return out


def _builtin(group: str, version: str, kind: str, plural: str, namespaced: bool = True,
             subresources: tuple[str, ...] = (), generation: bool = False,
             short_names: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(group, version, kind, plural, namespaced, kind.lower(), short_names,
                        frozenset(subresources), generation)


BUILTINS: tuple[ResourceType, ...] = (
    _builtin("", "v1", "Namespace", "namespaces", False, ("status",), short_names=("ns",)),
    _builtin("", "v1", "Secret", "secrets"),
    _builtin("", "v1", "ConfigMap", "configmaps", short_names=("cm",)),
    _builtin("", "v1", "Node", "nodes", False, ("status",), short_names=("no",)),
    _builtin("", "v1", "Pod", "pods", True, ("status", "eviction"), short_names=("po",)),
    _builtin("", "v1", "Event", "events", short_names=("ev",)),
    _builtin("", "v1", "ServiceAccount", "serviceaccounts", short_names=("sa",)),
    _builtin("apps", "v1", "Deployment", "deployments", True, ("status",), True, ("deploy",)),
    _builtin("apps", "v1", "DaemonSet", "daemonsets", True, ("status",), True, ("ds",)),
    # Stored and served (a rehearsal reads them); no controller: the simulator schedules no StatefulSet's pods.
    _builtin("apps", "v1", "StatefulSet", "statefulsets", True, ("status",), True, ("sts",)),
    _builtin("coordination.k8s.io", "v1", "Lease", "leases"),
    _builtin("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, ("status",), True, ("pdb",)),
    _builtin("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
             ("status",), True, ("crd", "crds")),
)

#: Preferred versions of the built-in groups, for /apis.
BUILTIN_GROUPS: tuple[tuple[str, str], ...] = (
    ("apps", "v1"), ("coordination.k8s.io", "v1"), ("policy", "v1"), ("apiextensions.k8s.io", "v1"),
)


def types_from_crd(crd: JSON) -> list[ResourceType]:
    """One ResourceType per served version of an apiextensions.k8s.io/v1 CRD."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        subs = tuple(sorted((ver.get("subresources") or {}).keys()))
        schema = (ver.get("schema") or {}).get("openAPIV3Schema")
        out.append(ResourceType(
            group=spec["group"], version=ver["name"], kind=names["kind"], plural=names["plural"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular", names["kind"].lower()),
            short_names=tuple(names.get("shortNames", [])), subresources=frozenset(subs),
            generation=True, custom=True, schema=schema,
            printer_columns=tuple(ver.get("additionalPrinterColumns", [])),
            categories=tuple(names.get("categories", [])),
        ))
    return out
