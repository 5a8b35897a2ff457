"""Talos's strategic merge of one patch document into a configuration document.

Go's merge.Merge semantics on YAML trees: maps merge key by key; a scalar replaces unless it is its
type's zero value ("" or 0; false always replaces); lists append, except where Talos replaces them
or merges elements by key (Talos's patching docs, `merge:"replace"` tags, the types with their own
Merge method). A few types' Merge takes the patch's value even when the patch leaves it unset (CEL
expressions, byte sizes): any merge into their document clears them unless the patch gives them.
Paths are key tuples inside one document; ``[]`` stands for "any element of the list".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ichord.render.config import V1ALPHA1

Path = tuple[str, ...]

#: Values the patch replaces instead of merging into.
REPLACE: dict[str, frozenset[Path]] = {
    V1ALPHA1: frozenset({
        ("cluster", "network", "podSubnets"),
        ("cluster", "network", "serviceSubnets"),
        ("cluster", "apiServer", "auditPolicy"),
    }),
    "KubeNetworkConfig": frozenset({("podSubnets",), ("serviceSubnets",)}),
    # The audit policy document carries the same value v1alpha1's auditPolicy did.
    "KubeAuditPolicyConfig": frozenset({("configuration",)}),
    "KubeAuthenticationConfig": frozenset({("configuration",)}),
    "KubeCredentialProviderConfig": frozenset({("configuration",)}),
    "KubeStaticPodConfig": frozenset({("pod",)}),
    "ResolverConfig": frozenset({("searchDomains",)}),
}

#: Values whose Go type's Merge sets the patch's value unconditionally (cel.Expression,
#: block.ByteSize) on a path Go's merge always walks (struct fields, no pointer on the way): a merge
#: into the document clears them unless the patch gives them. Emptied mappings above them go too.
_VOLUME = frozenset({("provisioning", "diskSelector", "match"), ("provisioning", "minSize")})
ALWAYS_REPLACED: dict[str, frozenset[Path]] = {
    "UnattendedInstallConfig": frozenset({("provisioning", "diskSelector", "match")}),
    "VolumeConfig": _VOLUME,
    "UserVolumeConfig": _VOLUME,
    "RawVolumeConfig": _VOLUME,
    "SwapVolumeConfig": _VOLUME,
}

#: Lists whose elements merge with the existing element having the same key.
KEYED: dict[str, dict[Path, tuple[str, ...]]] = {
    V1ALPHA1: {
        ("machine", "network", "interfaces"): ("interface", "deviceSelector"),
        ("machine", "network", "interfaces", "[]", "vlans"): ("vlanId",),
        # AdmissionPluginConfigList.Merge: a plugin named again merges into the one there.
        ("cluster", "apiServer", "admissionControl"): ("name",),
    },
    "ExtensionServiceConfig": {("configFiles",): ("mountPath",)},
}

#: Maps whose values a patch replaces key by key (Talos's Args.Merge, maps.Copy): an
#: `extraArgs` value given again, string or list, replaces the one there instead of appending.
_ARGS = frozenset({("extraArgs",)})
ARGS: dict[str, frozenset[Path]] = {
    V1ALPHA1: frozenset({
        ("machine", "kubelet", "extraArgs"),
        ("cluster", "apiServer", "extraArgs"),
        ("cluster", "controllerManager", "extraArgs"),
        ("cluster", "proxy", "extraArgs"),
        ("cluster", "scheduler", "extraArgs"),
        ("cluster", "etcd", "extraArgs"),
    }),
    "KubeletConfig": _ARGS,
    "KubeAPIServerConfig": _ARGS,
    "KubeControllerManagerConfig": _ARGS,
    "KubeSchedulerConfig": _ARGS,
    "KubeProxyConfig": _ARGS,
}

_NONE: frozenset[Path] = frozenset()


@dataclass(frozen=True)
class _Rules:
    replace: frozenset[Path]
    keyed: dict[Path, tuple[str, ...]]
    args: frozenset[Path]


def _rules(kind: str) -> _Rules:
    return _Rules(REPLACE.get(kind, _NONE), KEYED.get(kind, {}), ARGS.get(kind, _NONE))


class MergeConflict(Exception):
    """The patch gives ``path`` another shape (mapping / list / scalar) than the configuration."""

    def __init__(self, path: Path, left: str, right: str) -> None:
        super().__init__(".".join(path))
        self.path, self.left, self.right = path, left, right


def merge(left: dict[str, Any], right: dict[str, Any], kind: str) -> None:
    """Merge ``right`` into ``left`` (a document of ``kind``; "v1alpha1" for the legacy one) in place."""
    for path in ALWAYS_REPLACED.get(kind, _NONE):
        if _get(right, path) is None:
            _clear(left, path)
    _merge(left, right, (), _rules(kind))


def _get(node: Any, path: Path) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _clear(node: Any, path: Path) -> None:
    """Remove ``path`` and the mappings it leaves empty (omitempty structs; zerofields puts back any
    struct Talos always writes)."""
    parents = []
    for key in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents):
        if parent[key]:
            break
        del parent[key]


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return "scalar"


def _is_zero(value: Any) -> bool:
    # Go's merge keeps the left value when the right one is its type's zero value; false is set.
    if isinstance(value, bool):
        return False
    return value == "" or (isinstance(value, int | float) and value == 0)


def _merge(left: Any, right: Any, path: Path, rules: _Rules) -> Any:
    if right is None:
        return left
    if left is None:
        return right
    if isinstance(right, dict):
        if not isinstance(left, dict):
            raise MergeConflict(path, _kind(left), _kind(right))
        if path in rules.replace:
            return right
        args = path in rules.args
        for key, value in right.items():
            if args and value is not None:
                left[key] = value
            elif key in left and left[key] is not None:
                left[key] = _merge(left[key], value, (*path, str(key)), rules)
            elif value is not None:
                left[key] = value
        return left
    if isinstance(right, list):
        if not isinstance(left, list):
            raise MergeConflict(path, _kind(left), _kind(right))
        if path in rules.replace:
            return right
        keys = rules.keyed.get(path)
        for item in right:
            match = _keyed_match(left, item, keys) if keys else None
            if match is None:
                left.append(item)
            else:
                left[match] = _merge(left[match], item, (*path, "[]"), rules)
        return left
    if isinstance(left, dict | list):
        raise MergeConflict(path, _kind(left), _kind(right))
    return left if _is_zero(right) else right


def _keyed_match(items: list[Any], item: Any, keys: tuple[str, ...]) -> int | None:
    if not isinstance(item, dict):
        return None
    for i, existing in enumerate(items):
        if isinstance(existing, dict) and any(k in item and k in existing and item[k] == existing[k] for k in keys):
            return i
    return None
