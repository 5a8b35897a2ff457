"""render(): the full machine configuration `talosctl gen config` generates, then the config patches.

Contract v1.13 renders the legacy layout (legacy.py), v1.14 the multi-document one (multidoc.py).
Cluster patches apply first, then machine patches, as Talos's configpatcher applies a list. Each
strategic merge patch is checked by Talos's strict decoder's rules before it merges (Talos decodes a
patch before applying it), and the result again (JSON6902 patches change it as text): unknown fields
and wrong types raise InvalidConfigError (render/strict.py). The result is then checked structurally;
any failure raises before anything is returned.
"""

from __future__ import annotations

from collections.abc import Sequence

from ichord.contract import SUPPORTED_CONTRACTS, VersionContract
from ichord.pki import targets as ca_targets
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind
from ichord.render import decoded, keyorder, legacy, multidoc, zerofields
from ichord.render.config import MachineConfig
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.patch import Merge, Patch, StrategicPatch, apply_patches, doc_id, load_patch, touched
from ichord.render.strict import check_config, check_document
from ichord.render.validate import check_structure


def generate(bundle: SecretsBundle, cluster: ClusterInputs, machine: MachineInputs) -> MachineConfig:
    """What `talosctl gen config` writes for this machine, before any patch."""
    if cluster.contract not in SUPPORTED_CONTRACTS:
        supported = ", ".join(str(c) for c in SUPPORTED_CONTRACTS)
        raise RenderError(f"cannot render for Talos contract {cluster.contract}; ichord renders {supported}")
    if cluster.contract.multidoc_kubernetes:
        return MachineConfig(multidoc.generate(bundle, cluster, machine))
    return MachineConfig(legacy.generate(bundle, cluster, machine))


def load_patches(cluster: ClusterInputs, machine: MachineInputs) -> list[Patch]:
    patches = [load_patch(text, f"cluster patch {i + 1}") for i, text in enumerate(cluster.patches)]
    patches += [load_patch(text, f"machine patch {i + 1}") for i, text in enumerate(machine.patches)]
    return patches


def _place_target_cas(config: MachineConfig, bundle: SecretsBundle, machine: MachineInputs,
                      contract: VersionContract) -> None:
    """A registered CA-rotation target whose CA the bundle keeps beside Talos's four (ichord/pki/targets) is placed by
    its render writer, as the generator places those four: a rotation's stages then add only what is trusted."""
    control_plane = str(getattr(machine.role, "value", machine.role)) == "controlplane"
    for target in ca_targets.REGISTRY:
        if isinstance(target.ca_kind, CAKind) or target.render_writer is None or not bundle.holds(target.ca_kind):
            continue
        target.render_writer(config, bundle.ca(target.ca_kind).cert_pem, control_plane, contract)


def render(
    bundle: SecretsBundle,
    cluster: ClusterInputs,
    machine: MachineInputs,
    *,
    extra_patches: Sequence[Patch] = (),
) -> MachineConfig:
    """The machine's full configuration: generated, cluster patches, machine patches, ``extra_patches``.

    ``extra_patches`` (already loaded) come last; the CA-rotation stages use them.
    """
    config = generate(bundle, cluster, machine)
    _place_target_cas(config, bundle, machine, cluster.contract)
    patches = [*load_patches(cluster, machine), *extra_patches]
    for patch in patches:
        if isinstance(patch, StrategicPatch):
            for step in patch.steps:
                if isinstance(step, Merge):
                    check_document(step.content, cluster.contract, patch.label)
    if patches:
        docs = apply_patches(config.documents, patches, in_place=True)
        # Only documents a patch changed can have keys out of Talos's order, lack a field it writes or hold what
        # its decoder refuses (the generator's own documents decode: tests/unit/test_render_strict.py).
        changed = touched(patches)
        # Before ichord's own normalising, which expects the documents' types (a JSON6902 patch may break them).
        check_config(MachineConfig([d for d in docs if doc_id(d) in changed]), cluster.contract,
                     "the patched configuration")
        config = MachineConfig([keyorder.normalize(zerofields.fill(decoded.normalize(d))) if doc_id(d) in changed
                                else d
                                for d in docs])
    check_structure(config, machine.role)
    return config
