"""The BundleSource: one read of the bundle Secret, views parsed once, one error vocabulary (issue 13)."""

from __future__ import annotations

import base64

import pytest

from ichord.api.names import SECRETS_KEY
from ichord.kube.reads import SecretData
from ichord.operations.bundle_source import BundleRead, BundleSourceError, rotation_ca_certificate
from ichord.pki.bundle import generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.pki.rotation import Rotation, Target, generate_rotation


def test_rotation_yaml_gives_the_kubernetes_certificate_never_the_key() -> None:
    rotation = generate_rotation((Target.TALOS, Target.KUBERNETES))
    new = rotation.new[Target.KUBERNETES]
    cert = rotation_ca_certificate(rotation.to_yaml().encode(), Target.KUBERNETES)
    assert cert == new.cert_pem
    assert new.key_pem is not None and b"PRIVATE KEY" not in (cert or b"")
    talos_only = Rotation({Target.TALOS: generate_ca(CAKind.OS)})
    assert rotation_ca_certificate(talos_only.to_yaml().encode(), Target.KUBERNETES) is None
    for bad, why in ((b"{a", "not valid YAML"), (b"- a list", "not a mapping"),
                     (b"kubernetes: {key: abc}", "without crt"), (b"kubernetes: {crt: '!!!'}", "base64")):
        with pytest.raises(BundleSourceError, match=why):
            rotation_ca_certificate(bad, Target.KUBERNETES)



def test_the_current_ca_certificate_is_read_by_libyaml_and_ruamel_decides_what_it_does_not_mirror() -> None:
    bundle = generate_bundle()
    raw = bundle.to_yaml().encode()
    read = BundleRead(SecretData("secrets", "ns", "1", {SECRETS_KEY: raw}))
    assert read.ca_certificate(CAKind.KUBERNETES) == bundle.k8s.cert_pem
    assert read.ca_certificate(CAKind.OS) == bundle.os.cert_pem
    # A merge key is YAML libyaml reads otherwise than ruamel: ruamel's answer is the one given.
    crt = base64.b64encode(bundle.k8s.cert_pem).decode()
    merged = f"base: &b {{crt: {crt}}}\ncerts:\n  k8s:\n    <<: *b\n".encode()
    read = BundleRead(SecretData("secrets", "ns", "2", {SECRETS_KEY: merged}))
    assert read.ca_certificate(CAKind.KUBERNETES) == bundle.k8s.cert_pem
    read = BundleRead(SecretData("secrets", "ns", "3", {SECRETS_KEY: b"certs: {k8s: [1, 2"}))
    assert read.ca_certificate(CAKind.KUBERNETES) is None  # not YAML for either: no certificate, no error
