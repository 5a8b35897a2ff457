"""The secrets bundle: byte-for-byte round trips, refusal of bad bundles, file handling."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from ichord.pki.bundle import BundleError, BundleExistsError, SecretsBundle, generate_bundle


@pytest.mark.parametrize("name", ["secrets-sample.yaml", "stability/secrets.yaml"])
def test_upstream_bundle_round_trips_byte_for_byte(talos_samples: Path, name: str) -> None:
    raw = (talos_samples / name).read_text()
    bundle = SecretsBundle.from_yaml(raw)
    assert bundle.to_yaml() == raw


def test_changed_bundle_changes_only_what_changed(talos_samples: Path) -> None:
    raw = (talos_samples / "stability/secrets.yaml").read_text()
    bundle = SecretsBundle.from_yaml(raw)
    fresh = generate_bundle()
    out = bundle.with_cas({}).to_yaml()
    assert out == raw
    changed = SecretsBundle.from_yaml(raw).with_cas({k: fresh.ca(k) for k in []})
    assert changed.to_yaml() == raw
    from ichord.pki.ca import CAKind

    rotated = bundle.with_cas({CAKind.OS: fresh.os}).to_yaml()
    diff = [(a, b) for a, b in zip(raw.splitlines(), rotated.splitlines(), strict=True) if a != b]
    # Only the two lines of certs.os changed; the leading comment and everything else stayed.
    assert len(diff) == 2
    assert all(line.strip().startswith(("crt:", "key:")) for line, _ in diff)
    assert rotated.startswith("# test set of secrets")


def test_invalid_sample_is_refused_with_every_problem_named(talos_samples: Path) -> None:
    with pytest.raises(BundleError) as info:
        SecretsBundle.load(talos_samples / "invalid-secrets-sample.yaml")
    problems = info.value.problems
    assert "cluster.secret is missing" in problems
    assert "trustdinfo.token is missing" in problems
    assert "certs.etcd.key is missing" in problems
    assert "certs.os.crt is missing" in problems
    assert any("secretboxencryptionsecret" in p for p in problems)
    assert "LS0t" not in str(info.value)  # no material in the message


def test_generated_bundle_round_trips_and_has_talos_layout() -> None:
    bundle = generate_bundle()
    text = bundle.to_yaml()
    again = SecretsBundle.from_yaml(text)
    assert again.to_yaml() == text
    top = [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")]
    assert top == ["cluster", "secrets", "trustdinfo", "certs"]
    certs = [
        line.strip().rstrip(":")
        for line in text.splitlines()
        if line.startswith("    ") and not line.startswith("        ") and line.strip().endswith(":")
    ]
    assert certs[-5:] == ["etcd", "k8s", "k8saggregator", "k8sserviceaccount", "os"]
    assert "aescbcencryptionsecret" not in text
    assert len(base64.b64decode(bundle.secretbox_encryption_secret or "")) == 32
    assert len(base64.urlsafe_b64decode(bundle.cluster_id)) == 32
    token, _, rest = bundle.bootstrap_token.partition(".")
    assert len(token) == 6 and len(rest) == 16


def test_os_key_uses_talos_label() -> None:
    bundle = generate_bundle()
    assert bundle.os.key_pem is not None
    assert bundle.os.key_pem.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----\n")
    assert bundle.k8s.key_pem is not None and bundle.k8s.key_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert bundle.k8s_service_account_key.startswith(b"-----BEGIN RSA PRIVATE KEY-----")


def test_save_is_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "secrets.yaml"
    bundle = generate_bundle()
    bundle.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert SecretsBundle.load(path).to_yaml() == bundle.to_yaml()
    with pytest.raises(BundleExistsError):
        generate_bundle().save(path)
    assert SecretsBundle.load(path).to_yaml() == bundle.to_yaml()  # nothing written
    other = generate_bundle()
    other.save(path, force=True)
    assert SecretsBundle.load(path).to_yaml() == other.to_yaml()


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.replace("cluster:", "cluster: [", 1), "not valid YAML"),
        (lambda t: "- a\n- b\n", "not a YAML mapping"),
        (
            lambda t: t.replace("    os:\n        crt: ", "    os:\n        crt: notbase64!"),
            "certs.os.crt is not valid base64",
        ),
    ],
)
def test_malformed_bundles_are_refused(mutate: object, expected: str) -> None:
    text = generate_bundle().to_yaml()
    assert callable(mutate)
    with pytest.raises(BundleError) as info:
        SecretsBundle.from_yaml(mutate(text))
    assert expected in str(info.value)


def test_key_of_another_ca_is_refused() -> None:
    a, b = generate_bundle(), generate_bundle()
    text = a.to_yaml()
    a_key = base64.b64encode(a.k8s.key_pem or b"").decode()
    b_key = base64.b64encode(b.k8s.key_pem or b"").decode()
    with pytest.raises(BundleError) as info:
        SecretsBundle.from_yaml(text.replace(a_key, b_key))
    assert "certs.k8s.key does not belong to certs.k8s.crt" in info.value.problems


def test_repr_holds_no_secret() -> None:
    bundle = generate_bundle()
    text = repr(bundle)
    for secret in bundle.secret_values():
        assert secret not in text
    assert bundle.cluster_id not in text
