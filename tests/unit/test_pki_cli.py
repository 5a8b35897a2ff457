"""`ichord bundle generate` smoke tests."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ichord.cli import main
from ichord.pki.bundle import SecretsBundle


def test_bundle_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "secrets.yaml"
    assert main(["bundle", "generate", "-o", str(out), "--talos-version", "v1.13"]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    SecretsBundle.load(out)
    printed = capsys.readouterr().out
    assert "wrote" in printed and "BEGIN" not in printed
    assert main(["bundle", "generate", "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["bundle", "generate", "-o", str(out), "--force"]) == 0


def test_bundle_generate_unknown_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.yaml"
    assert main(["bundle", "generate", "-o", str(out), "--talos-version", "v1.9"]) == 2
    assert not out.exists()
    assert "not supported" in capsys.readouterr().err
