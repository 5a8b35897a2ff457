"""`ichord render` smoke tests through ichord.cli.main."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord import yamlio
from ichord.cli import main
from ichord.contract import VersionContract
from ichord.pki.bundle import generate_bundle
from ichord.render.config import MachineConfig


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("render") / "secrets.yaml"
    generate_bundle(VersionContract(1, 6)).save(path)
    return path


def _flags(bundle: Path) -> list[str]:
    return ["render", "--bundle", str(bundle), "--cluster-name", "c", "--endpoint", "https://c.example:6443",
            "--kubernetes-version", "1.34.1"]


def test_render_from_flags(bundle_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_flags(bundle_file)) == 0
    cfg = MachineConfig.parse(capsys.readouterr().out)
    assert cfg.v1alpha1["machine"]["type"] == "controlplane"
    assert cfg.find("KubeAPIServerCAConfig") is not None  # v1.14 is the default contract

    assert main([*_flags(bundle_file), "--talos-version", "v1.13", "--role", "worker"]) == 0
    cfg = MachineConfig.parse(capsys.readouterr().out)
    assert cfg.v1alpha1["machine"]["type"] == "worker"
    assert cfg.v1alpha1["cluster"]["clusterName"] == "c" and cfg.find("KubeAPIServerCAConfig") is None


def test_render_from_objects(bundle_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yamlio.dump({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster", "metadata": {"name": "prod"},
        "spec": {"secretsRef": {"name": "s"}, "endpoint": "https://prod.example:6443", "kubernetesVersion": "1.34.1",
                 "talosVersion": "v1.14", "patches": ["machine:\n  network:\n    hostname: x\n"]},
    }))
    machine = tmp_path / "machine.yaml"
    machine.write_text(yamlio.dump({"role": "worker", "patches": ["machine:\n  network:\n    hostname: y\n"]}))
    assert main(["render", "--bundle", str(bundle_file), "--cluster", str(cluster), "--machine", str(machine)]) == 0
    cfg = MachineConfig.parse(capsys.readouterr().out)
    assert cfg.v1alpha1["machine"]["type"] == "worker"
    assert cfg.v1alpha1["machine"]["network"]["hostname"] == "y"
    assert cfg.find("KubeClusterConfig")["clusterName"] == "prod"  # type: ignore[index]


@pytest.mark.parametrize(("extra", "message"), [
    (["--talos-version", "v1.9"], "--talos-version"),
    (["--endpoint", "http://c:6443"], "--endpoint"),
])
def test_bad_input_exits_2_with_nothing_on_stdout(
    bundle_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main([*_flags(bundle_file), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_bad_bundle_patch_and_missing_flags(bundle_file: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("cluster: {id: x}\n")
    assert main(["render", "--bundle", str(broken), "--cluster-name", "c", "--endpoint", "https://c:6443",
                 "--kubernetes-version", "1.34.1"]) == 2
    assert capsys.readouterr().out == ""

    machine = tmp_path / "m.yaml"
    machine.write_text(yamlio.dump({"role": "controlplane", "patches": ["version: v1alpha1\n$patch: delete\n"]}))
    assert main([*_flags(bundle_file), "--machine", str(machine)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "machine patch 1" in err

    assert main(["render", "--bundle", str(bundle_file), "--cluster-name", "c"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--endpoint" in err and "--kubernetes-version" in err

    assert main([*_flags(bundle_file), "--cluster", str(machine)]) == 2
    assert "cannot be combined with --cluster" in capsys.readouterr().err


def test_missing_bundle_is_a_typed_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--cluster-name", "c", "--endpoint", "https://c:6443", "--kubernetes-version", "1.3.0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--bundle" in err


def test_render_diff_is_routed_to_its_subcommand(tmp_path: Path) -> None:
    pytest.importorskip("ichord.render.diff_cli")
    from ichord.cli import build_parser

    args = build_parser().parse_args(["render", "diff", "old.yaml", "new.yaml", "--talos-version", "v1.14"])
    assert args.render_command == "diff"
    assert args.func.__module__ == "ichord.render.diff_cli"
    args = build_parser().parse_args(["render", "--bundle", "b.yaml", "--cluster", "c.yaml"])
    assert args.render_command is None and args.func.__module__ == "ichord.render.cli"


def test_render_stage(bundle_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ichord.pki.bundle import SecretsBundle
    from ichord.pki.fingerprint import certificate_fingerprint
    from ichord.pki.pem import b64_pem_decode
    from ichord.pki.rotation import Target, generate_rotation

    rotation = generate_rotation((Target.TALOS, Target.KUBERNETES))
    rfile = tmp_path / "rotation.yaml"
    rfile.write_text(rotation.to_yaml())
    assert main([*_flags(bundle_file), "--stage", "Issuing", "--rotation", str(rfile), "--role", "worker"]) == 0
    config = MachineConfig.parse(capsys.readouterr().out)
    machine = config.v1alpha1["machine"]
    new_os = certificate_fingerprint(rotation.new[Target.TALOS].cert_pem)
    old_os = certificate_fingerprint(SecretsBundle.load(bundle_file).os.cert_pem)
    assert certificate_fingerprint(b64_pem_decode(machine["ca"]["crt"], "ca")) == new_os
    assert [certificate_fingerprint(b64_pem_decode(e["crt"], "a")) for e in machine["acceptedCAs"]] == [old_os]

    # the aggregator target is refused on v1.13, with nothing printed
    assert main([*_flags(bundle_file), "--talos-version", "v1.13", "--stage", "Accepting", "--rotation", str(rfile),
                 "--targets", "kubernetes-aggregator"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no new CA for target(s) kubernetes-aggregator" in captured.err
    assert main([*_flags(bundle_file), "--stage", "Sideways", "--rotation", str(rfile)]) == 2
    assert "unknown stage" in capsys.readouterr().err
    assert main([*_flags(bundle_file), "--stage", "Issuing"]) == 2


@pytest.mark.parametrize("talos_version", ["v1.13", "v1.14"])
@pytest.mark.parametrize(("patch", "message"), [
    ("machine:\n  env: just-a-string\n", "machine.env: expected a mapping (map[string]string), found a string"),
    ("machine:\n  nonsense: 1\n", "machine.nonsense: unknown field"),
    ("apiVersion: v1alpha1\nkind: HostnameConfig\nauto: sometimes\n", "auto: expected one of off, "),
])
def test_what_talos_refuses_exits_2_naming_the_field(
        bundle_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], talos_version: str, patch: str,
        message: str) -> None:
    """A wrong type or an unknown field (Talos's decoder refuses both) is never printed as a configuration."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yamlio.dump({"endpoint": "https://c.example:6443", "kubernetesVersion": "1.34.1",
                                    "clusterName": "c", "talosVersion": talos_version, "patches": [patch]}))
    assert main(["render", "--bundle", str(bundle_file), "--cluster", str(cluster)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "cluster patch 1" in err and message in err, err
