"""Issue 29: a made-up CA-rotation target, ``webhook``, written only in this file, the way a real target is written
(docs/architecture.md#how-to-add-a-ca-target) but without touching ichord: a second front-proxy-like CA that only
the control planes carry, kept in the secrets bundle under a key of its own (``certs.webhook``), which a
validating-webhook server would be given to trust its callers.

    where                 what
    secrets.yaml          certs.webhook.{crt,key}, made with ``PROFILE`` (ECDSA P-256, CN webhook-ca)
    rotation.yaml         webhook: {crt, key}
    machine config        machine.nodeAnnotations[webhook.example.test/ca-bundle]: a PEM bundle, the first
                          certificate signing, every one trusted (control planes only; the Node carries it)
    the node's view       read back from the node's running configuration (COSI MachineConfigs.config.talos.dev)

Talos applies changed node annotations without a reboot and restarts nothing for them, so the target
needs neither the kube-apiserver restart nor the reboot roll; it hands no credentials off, and Issuing is not a
point of no return (the old CA is still trusted there, as the aggregator's is).

Registering it is one line: ``ca_targets.register(TARGET)``. The CRDs ichord ships admit only its own targets:
``fake_target_crds`` are the copies a test serves (the name in the TalosOperation's targets enum and in the
TalosCluster's status.certificates enum).
"""

from __future__ import annotations

import copy
from typing import Any

from ruamel.yaml.comments import CommentedMap

from ichord import yamlio
from ichord.contract import VersionContract
from ichord.pki import pem as _pem
from ichord.pki.ca import CAProfile, KeyAlgorithm
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.targets import TargetDescription
from ichord.render.config import MachineConfig
from ichord.talos.client import TalosClient

Obj = dict[str, Any]

NAME = "webhook"
ANNOTATION = "webhook.example.test/ca-bundle"
PROFILE = CAProfile(KeyAlgorithm.ECDSA_P256, organization=None, common_name="webhook-ca")


def _annotations(config: MachineConfig) -> Any:
    machine = config.v1alpha1.setdefault("machine", CommentedMap())
    found = machine.get("nodeAnnotations")
    if not isinstance(found, dict):
        found = CommentedMap()
        machine["nodeAnnotations"] = found
    return found


def write(config: MachineConfig, cert_pem: bytes, control_plane: bool, _contract: VersionContract) -> None:
    """The render writer: ``cert_pem`` added to the annotation's bundle (created with it first: the signing CA, as
    the renderer places it); control planes only. Adding a certificate the bundle holds changes nothing."""
    if not control_plane:
        return
    annotations = _annotations(config)
    held = str(annotations.get(ANNOTATION) or "").encode()
    if cert_pem.strip() in [b.strip() for b in (_pem.pem_blocks(held) if held.strip() else [])]:
        return
    annotations[ANNOTATION] = (held + cert_pem).decode()


def view_of(config_bytes: bytes) -> dict[str, Any]:
    """``{"issuing", "trusted"}`` fingerprints as the configuration's annotation carries them."""
    pem = b""
    for doc in yamlio.load_all(config_bytes):
        if isinstance(doc, dict) and "machine" in doc:
            pem = str(((doc.get("machine") or {}).get("nodeAnnotations") or {}).get(ANNOTATION) or "").encode()
    blocks = _pem.pem_blocks(pem) if pem.strip() else []
    trusted = [certificate_fingerprint(b) for b in blocks]
    return {"issuing": trusted[0] if trusted else "", "trusted": trusted}


async def read(talos: TalosClient, address: str, _read: dict[str, Any]) -> dict[str, Any]:
    """The node reader: the node's running configuration (one COSI Get), its annotation's bundle."""
    return view_of(await talos.machine_config(address))


TARGET = TargetDescription(
    name=NAME, ca_kind="webhook", rotation_key="webhook", expiry_rank=25, default=False,
    control_plane_only=True, restarts_apiserver=False, reboot_roll=False, hands_off=False,
    issuing_is_point_of_no_return=False, profile=PROFILE, render_writer=write, node_reader=read,
)


def fake_target_crds(operation_crd: Obj, cluster_crd: Obj) -> tuple[Obj, Obj]:
    """The chart's TalosOperation and TalosCluster CRDs with ``webhook`` admitted (what step 3 of the how-to adds
    to the chart): a name in spec.caRotation.targets' enum and in status.certificates' names."""
    op, cluster = copy.deepcopy(operation_crd), copy.deepcopy(cluster_crd)
    for version in op["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        spec["caRotation"]["properties"]["targets"]["items"]["enum"].append(NAME)
    for version in cluster["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        status["certificates"]["items"]["properties"]["name"]["enum"].append(NAME)
    return op, cluster
