"""The BundleSource: one read of the bundle Secret, views parsed once, one error vocabulary (issue 13)."""

from __future__ import annotations

import pytest

from ichord.operations.bundle_source import BundleSourceError, rotation_ca_certificate
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

