"""The command line's shared habits: --version, and -n/--namespace meaning the TalosCluster's namespace."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from ichord.api.max_unavailable import MaxUnavailable
from ichord.cli import build_parser, main
from ichord.operations.config.cli import operation_object
from ichord.run_cli import deprecated_concurrency_env, settings_from_args
from ichord.settings import SettingsError

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


@pytest.mark.parametrize(("argv", "env", "want"), [
    ([], {}, "25%"),  # the daemon's default (issue 19)
    (["--max-unavailable", "10%"], {}, "10%"),
    (["--max-unavailable", "3"], {"ICHORD_MAX_UNAVAILABLE": "50%"}, "3"),  # the flag wins
    ([], {"ICHORD_MAX_UNAVAILABLE": "50%"}, "50%"),
    ([], {"ICHORD_CA_WORKER_APPLY_CONCURRENCY": "4"}, "4"),  # the deprecated alias, a count
])
def test_run_takes_the_daemons_max_unavailable(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str],
                                               want: str) -> None:
    for var in ("ICHORD_MAX_UNAVAILABLE", "ICHORD_CA_WORKER_APPLY_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    args = build_parser().parse_args(["run", *argv])
    assert str(settings_from_args(args).timing.max_unavailable) == want
    assert deprecated_concurrency_env(args, dict(env)) == ("ICHORD_CA_WORKER_APPLY_CONCURRENCY" in env)


@pytest.mark.parametrize("bad", ["0", "0%", "150%", "quarter"])
def test_run_refuses_a_bad_max_unavailable(bad: str) -> None:
    with pytest.raises(SettingsError, match="--max-unavailable must be a whole number of at least 1 or a percentage"):
        settings_from_args(build_parser().parse_args(["run", "--max-unavailable", bad]))


def test_config_apply_leaves_max_unavailable_to_the_cluster_unless_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert "maxUnavailable" not in operation_object("c", "op", max_unavailable=None, start=False)["spec"]
    spec = operation_object("c", "op", max_unavailable=MaxUnavailable.parse_text("20%"), start=True)["spec"]
    assert spec["maxUnavailable"] == "20%" and spec["paused"] is False
    assert main(["cluster", "config-apply", "c", "--max-unavailable", "0%"]) == 2
    assert "--max-unavailable must be a whole number of at least 1" in capsys.readouterr().err


def test_commands_that_print_state_take_o_json_yaml_and_file_outputs_take_f() -> None:
    every = subcommands(build_parser())
    for words in (("cluster", "status"), ("cluster", "config-apply"), ("cluster", "rotate")):
        out = options(every[words])["-o"]
        assert out.dest == "output" and list(out.choices or ()) == ["text", "json", "yaml"], words
    for words in (("bundle", "generate"), ("cluster", "bundle-export")):
        opts = options(every[words])
        assert opts["-f"] is opts["--file"] and opts["-f"].dest == "output", words
        assert opts["-o"].dest == "output" and opts["-o"].help == argparse.SUPPRESS, words  # the deprecated alias
    creds = options(every[("cluster", "credentials")])
    assert creds["-d"] is creds["--output-dir"] and creds["-o"].help == argparse.SUPPRESS
