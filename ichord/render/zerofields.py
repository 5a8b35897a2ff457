"""The fields Talos always writes in the typed documents ichord knows.

Talos encodes every document from its Go struct, so a field without ``omitempty`` is written even
when unset, as its Go zero value: "" for a string or URL, 0, {} for a struct or free-form object,
[] for a list. A patch can leave one unset (a document it adds, a ``$patch: delete`` of the field);
``fill`` writes it back as Talos does (machinery v1.14's struct tags). Nil pointers Talos writes as
null are left out: its loader reads an absent key alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ruamel.yaml.comments import CommentedMap

Path = tuple[str, ...]
Zero = Callable[[], Any]

_STR: Zero = str
_INT: Zero = int
_MAP: Zero = CommentedMap
_LIST: Zero = list

#: (kind, path of a mapping) -> its fields without omitempty and their zero values. A path ending
#: in "[]" is each element of a list.
_ALWAYS: dict[tuple[str, Path], tuple[tuple[str, Zero], ...]] = {
    ("DiscoveryServiceConfig", ()): (("name", _STR), ("endpoint", _STR)),
    ("DiscoveryIdentityConfig", ()): (("clusterID", _STR), ("clusterSecret", _STR)),
    ("UnattendedInstallConfig", ()): (("installer", _MAP), ("provisioning", _MAP)),
    ("SysctlConfig", ()): (("params", _MAP),),
    ("VolumeConfig", ()): (("name", _STR),),
    ("RegistryMirrorConfig", ()): (("name", _STR),),
    ("RegistryMirrorConfig", ("endpoints", "[]")): (("url", _STR),),
    ("KubeClusterConfig", ()): (("clusterName", _STR), ("endpoint", _STR)),
    ("KubeNodeConfig", ()): (("nodeIP", _MAP),),
    ("KubeletConfig", ()): (("image", _STR), ("config", _MAP)),
    ("KubeNetworkConfig", ()): (("dnsDomain", _STR), ("podSubnets", _LIST), ("serviceSubnets", _LIST)),
    ("KubePrismConfig", ()): (("port", _INT),),
    ("KubeAdmissionControlConfig", ()): (("name", _STR), ("configuration", _MAP)),
    ("KubeAuditPolicyConfig", ()): (("configuration", _MAP),),
    ("KubeAuthenticationConfig", ()): (("configuration", _MAP),),
    ("KubeAuthorizerConfig", ()): (("name", _STR), ("type", _STR)),
    ("KubeEtcdEncryptionConfig", ()): (("config", _MAP),),
    ("KubeServiceAccountConfig", ()): (("issuer", _MAP),),
    ("KubeServiceAccountConfig", ("issuer",)): (("privateKey", _STR), ("issuerURL", _STR)),
    ("KubeAPIServerConfig", ()): (("image", _STR),),
    ("KubeControllerManagerConfig", ()): (("image", _STR),),
    ("KubeSchedulerConfig", ()): (("image", _STR), ("config", _MAP)),
    ("KubeProxyConfig", ()): (("config", _MAP),),
    ("KubeFlannelCNIConfig", ()): (("backendType", _STR),),
    ("KubeExternalManifestConfig", ()): (("name", _STR), ("url", _STR)),
}
#: kind -> its paths in _ALWAYS, outer before inner (an added struct is then filled in turn).
_PATHS: dict[str, tuple[Path, ...]] = {kind: tuple(p for k, p in _ALWAYS if k == kind) for kind, _ in _ALWAYS}


def fill(doc: CommentedMap) -> CommentedMap:
    """``doc`` (changed in place) with the fields Talos always writes that it lacks, zero-valued.

    Keys land at the end: keyorder.normalize puts them in their field's place afterwards.
    """
    kind = doc.get("kind")
    for path in _PATHS.get(kind, ()) if isinstance(kind, str) else ():
        for mapping in _at(doc, path):
            for key, zero in _ALWAYS[(kind, path)]:
                if key not in mapping:
                    mapping[key] = zero()
    return doc


def _at(node: Any, path: Path) -> list[dict[str, Any]]:
    """The mappings at ``path`` ("[]": every element of a list); none where the path is not there."""
    nodes = [node]
    for step in path:
        if step == "[]":
            nodes = [v for n in nodes if isinstance(n, list) for v in n]
        else:
            nodes = [n[step] for n in nodes if isinstance(n, dict) and step in n]
    return [n for n in nodes if isinstance(n, dict)]
