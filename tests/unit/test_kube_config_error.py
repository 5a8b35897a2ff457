"""A kubeconfig that cannot be used is a typed, one-line error naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.cli import main
from ichord.kube.client import from_kubeconfig
from ichord.kube.errors import KubeConfigError

pytestmark = pytest.mark.anyio

#: Every subcommand that reads a kubeconfig given with --kubeconfig.
COMMANDS = (["cluster", "bundle-export", "demo"], ["cluster", "credentials", "demo"], ["cluster", "status", "demo"],
            ["run", "--metrics-addr", "127.0.0.1:0"])
KEY_LIKE = "c2VjcmV0LWtleS1tYXRlcmlhbA=="


def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what the message must say)."""
    malformed = tmp_path / "malformed"
    # The broken line carries key-like data: the message gives the position, never the text around it.
    malformed.write_text(f"apiVersion: v1\nkind: Config\nusers:\n- user: {{client-key-data: {KEY_LIKE}\n")
    no_context = tmp_path / "no-context"
    no_context.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: prod\n")
    no_current = tmp_path / "no-current"
    no_current.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    not_a_map = tmp_path / "list"
    not_a_map.write_text("- a\n- b\n")
    return {
        "missing": (tmp_path / "absent", "does not exist"),
        "malformed": (malformed, "is not valid YAML (line 5, column 1"),
        "no-context": (no_context, "has no context 'prod' (it has none); pass --context NAME"),
        "no-current": (no_current, "sets no current-context; pass --context NAME"),
        "not-a-map": (not_a_map, "is not a kubeconfig"),
    }


async def test_each_unusable_kubeconfig_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    for path, says in bad_files(tmp_path).values():
        with pytest.raises(KubeConfigError) as info:
            await from_kubeconfig(path)
        assert str(path) in str(info.value) and says in str(info.value)
        assert KEY_LIKE not in str(info.value)


async def test_a_context_not_in_the_file_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncurrent-context: a\n"
                    "contexts:\n- name: a\n  context: {cluster: c, user: u}\n")
    with pytest.raises(KubeConfigError, match=r"has no context 'nope' \(it has: a\)"):
        await from_kubeconfig(good, context="nope")


async def test_kubeconfig_from_the_environment_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "env-absent"))
    with pytest.raises(KubeConfigError, match=f"{tmp_path / 'env-absent'} does not exist"):
        await from_kubeconfig(None)


def test_every_command_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # `run` configures process-wide logging onto capsys's stream first; this test is about its exit only.
    monkeypatch.setattr("ichord.log.configure", lambda *_a, **_k: None)
    for path, says in bad_files(tmp_path).values():
        for command in COMMANDS:
            assert main([*command, "--kubeconfig", str(path)]) == 2, command
            captured = capsys.readouterr()
            assert captured.err.count("\n") == 1 and says in captured.err and str(path) in captured.err, command
            assert "Traceback" not in captured.err and captured.out == ""
        # The same through $KUBECONFIG, as most operators set it.
        monkeypatch.setenv("KUBECONFIG", str(path))
        for command in COMMANDS:
            assert main(command) == 2, command
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and str(path) in err, command
        monkeypatch.delenv("KUBECONFIG")
