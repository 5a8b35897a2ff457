"""Every command ichord names exists: in its messages (conditions, Events, CLI output, help) and in README.md.

The collector reads every string literal of ``ichord/`` (f-strings with their fields as placeholders) and
README.md, takes each command between backticks, each literal that is a command by itself, each line of a
README shell block, and checks that its subcommand words are a real parser path whose ``--help`` exits 0.
kubectl commands are checked the same way against kubectl itself (``kubectl VERB --help``), when one is
installed. tests/e2e/test_hints_pasted.py runs the hints themselves as printed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ichord.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
#: A field of an f-string, where the command's arguments go.
FIELD = "{}"
#: Commands named on purpose although they do not exist yet, each with why.
#: Commands a message may name before they exist (none now: `ichord etcd backup now` became
#: `ichord cluster etcd-snapshot`, issue 26).
NOT_YET: set[tuple[str, ...]] = set()

PROGRAM = r"(?:ichord|kubectl)(?:\{\})?"  # kubectl{flags} -n ...: the user's kubeconfig flags, when given
QUOTED = re.compile(rf"`({PROGRAM} [^`]*)`")
STARTS = re.compile(rf"^{PROGRAM} ")
AFTER = re.compile(rf"(?:start it with|[Nn]ext): ({PROGRAM} .*)$", re.MULTILINE)
#: kubectl flags that may come before the verb, with their value.
KUBECTL_FLAGS = {"-n", "--namespace", "--kubeconfig", "--context"}
WORD = re.compile(r"^[a-z][a-z0-9-]*$")


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else FIELD for v in node.values)  # type: ignore[misc]
    return None


def code_texts() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "ichord").rglob("*.py")):
        if "gen" in path.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        # Concatenated literals are one string in the AST already ("a " "b" -> "a b"); so are f-strings.
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                continue
            text = _literal(node)
            if text and ("ichord " in text or "kubectl " in text):
                out.append((f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}", text))
    return out


def readme_texts() -> list[tuple[str, str]]:
    out = []
    in_shell = False
    for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            in_shell = line.strip() in ("```sh", "```bash", "```console")
            continue
        if in_shell:
            out.append((f"README.md:{n}", line.split("#", 1)[0].strip().rstrip("\\").strip()))
        else:
            out += [(f"README.md:{n}", m) for m in QUOTED.findall(line)]
    return out


def commands(text: str) -> list[str]:
    found = [m.strip() for m in QUOTED.findall(text)] + [m.strip() for m in AFTER.findall(text)]
    if STARTS.match(text) and not found:
        found.append(text.strip())
    return found


def words(command: str) -> tuple[str, tuple[str, ...]]:
    """The program and its subcommand words ("ichord cluster status NAME -n" -> ("ichord", ("cluster", "status")))."""
    program, *rest = command.replace(";", " ").split()
    program = program.removesuffix(FIELD)
    if program == "kubectl":
        while rest and (rest[0] in KUBECTL_FLAGS or rest[0] == FIELD):
            rest = rest[1:] if rest[0] == FIELD else rest[2:]
    out = []
    for token in rest:
        if not WORD.match(token):
            break
        out.append(token)
    return program, tuple(out)


def named() -> dict[tuple[str, tuple[str, ...]], str]:
    """Every command named, by (program, words) -> where first."""
    out: dict[tuple[str, tuple[str, ...]], str] = {}
    for where, text in code_texts() + readme_texts():
        for command in commands(text):
            out.setdefault(words(command), where)
    return out


def ichord_paths() -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        paths.add(prefix)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*prefix, name))

    walk(build_parser(), ())
    return paths


def longest_path(ws: tuple[str, ...], paths: set[tuple[str, ...]]) -> tuple[str, ...]:
    for n in range(len(ws), -1, -1):
        if ws[:n] in paths:
            return ws[:n]
    return ()


def has_subcommands(path: tuple[str, ...], paths: set[tuple[str, ...]]) -> bool:
    return any(len(p) > len(path) and p[:len(path)] == path for p in paths)


NAMED = named()
ICHORD = sorted((ws, where) for (program, ws), where in NAMED.items() if program == "ichord")
KUBECTL = sorted({ws[:1]: where for (program, ws), where in NAMED.items() if program == "kubectl" and ws}.items())


def test_the_collector_finds_the_hints() -> None:
    """It sees the commands the daemon's messages name (a collector that finds nothing would pass anything)."""
    found = {ws for ws, _ in ICHORD}
    for expected in [("cluster", "credentials"), ("cluster", "bundle-export"), ("cluster", "rotate"),
                     ("cluster", "config-apply"), ("cluster", "status"), ("run",), ("sim",), ("bundle", "generate")]:
        assert expected in found, expected
    assert ("patch",) in {ws for ws, _ in KUBECTL}


@pytest.mark.parametrize(("ws", "where"), ICHORD, ids=[" ".join(ws) or "ichord" for ws, _ in ICHORD])
def test_every_ichord_command_named_exists(ws: tuple[str, ...], where: str) -> None:
    paths = ichord_paths()
    path = longest_path(ws, paths)
    if ws in NOT_YET:
        assert ws not in paths, f"`ichord {' '.join(ws)}` exists now: drop it from NOT_YET"
        return
    # The first word is a command; a word after a command group must be one of its subcommands (after a
    # command without subcommands the words are its arguments: NAME, a file, or prose in a log line).
    bad = (ws and not path) or (has_subcommands(path, paths) and len(ws) > len(path))
    assert not bad, f"{where} names `ichord {' '.join(ws)}`, which is not a command"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0 and "usage: ichord" in out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("verb", "where"), KUBECTL, ids=[v[0] for v, _ in KUBECTL])
def test_every_kubectl_verb_named_exists(verb: tuple[str, ...], where: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on PATH")
    proc = subprocess.run([kubectl, *verb, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{where} names `kubectl {' '.join(verb)}`: {proc.stderr}"
