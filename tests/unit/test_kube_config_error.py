"""A kubeconfig that cannot be used is a typed, one-line error naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.cli import main
from ichord.kube.client import from_kubeconfig
from ichord.kube.errors import KubeConfigError

pytestmark = pytest.mark.anyio


async def test_a_missing_or_malformed_kubeconfig_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=str(tmp_path / "absent")):
        await from_kubeconfig(tmp_path / "absent")
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await from_kubeconfig(bad)
    with pytest.raises(KubeConfigError, match="nope"):
        await from_kubeconfig(bad, context="nope")


def test_the_commands_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["cluster", "bundle-export", "demo"], ["cluster", "credentials", "demo"]):
        assert main([*command, "--kubeconfig", str(tmp_path / "absent")]) == 2
        err = capsys.readouterr().err
        assert "cannot use the kubeconfig" in err and "Traceback" not in err
