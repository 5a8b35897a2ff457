"""The command line's shared habits: --version, and -n/--namespace meaning the TalosCluster's namespace."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from ichord.cli import build_parser, main

Parsers = dict[tuple[str, ...], argparse.ArgumentParser]


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Parsers:
    """Every (sub)command's parser, by its words."""
    out = {prefix: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= subcommands(sub, (*prefix, name))
    return out


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"ichord {importlib.metadata.version('ichord')}\n"


def test_n_is_namespace_wherever_it_exists() -> None:
    every = subcommands(build_parser())
    for words, parser in every.items():
        opts = options(parser)
        if "-n" in opts:
            assert opts["-n"] is opts["--namespace"], words
            assert opts["-n"].dest == "namespace"
    for words in (("cluster", "status"), ("cluster", "credentials"), ("cluster", "bundle-export"), ("sim",)):
        assert "-n" in options(every[words]), words


def test_run_takes_controller_namespace_and_still_the_old_spelling() -> None:
    parser = build_parser()
    new = parser.parse_args(["run", "--controller-namespace", "ops"])
    assert new.namespace == "ops" and not getattr(new, "deprecated_namespace_flag", False)
    old = parser.parse_args(["run", "--namespace", "ops"])  # the README recipe's spelling
    assert old.namespace == "ops" and old.deprecated_namespace_flag  # `run` logs a deprecation warning
    assert parser.parse_args(["run"]).namespace  # the default ($POD_NAMESPACE or ichord-system) is kept
    run_help = subcommands(parser)[("run",)].format_help()
    assert "--controller-namespace" in run_help and "--namespace" not in run_help.replace("--controller-namespace", "")
    assert "-n" not in options(subcommands(parser)[("run",)])  # -n would mean a TalosCluster's namespace
