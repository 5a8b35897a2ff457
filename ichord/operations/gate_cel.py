"""A CEL gate's expression: compiled once, its references checked against the variables a gate has, and its
errors told in a line a person can read (docs/health-gates.md).

cel-python compiles an expression without declarations, so ``foo == 1`` compiled and failed at each evaluation with
an error that printed the whole activation (14.7 KB of Python reprs in a condition). Here the parse tree is walked
at compile time: an identifier that is neither a declared variable, a comprehension's own variable nor a type name
is refused then, naming it and the variables there are. An error at evaluation is cut to its first sentence.
"""

from __future__ import annotations

import re
from typing import Any

import celpy
from lark import Token, Tree

#: The variables a CEL gate is evaluated with, as messages describe them.
VARIABLES = {"nodes": "the managed cluster's Nodes, a list of objects",
             "target": "the machine or CA-rotation pass the gates are asked for, a string"}
#: The comprehension macros: their first argument names a variable bound in the others.
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: CEL's type names, which an expression may name as values (``type(x) == string``), and the root of the
#: well-known types' message names.
_TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type",
                         "google"})
#: The longest evaluation error kept in a gate's message (the condition's own bound is larger).
_MAX_PROBLEM = 300


class CelSpecError(ValueError):
    """The expression cannot be a gate: the message says why, without the gate's name (its caller adds it)."""


def declared() -> str:
    """The declared variables, as a message names them."""
    return " and ".join(f"{name} ({what})" for name, what in VARIABLES.items())


def compile_expression(expression: str) -> Any:
    """The compiled program; CelSpecError when it does not parse or refers to a variable that is not declared."""
    env = celpy.Environment()
    try:
        tree = env.compile(expression)
    except Exception as exc:  # celpy raises its own parse errors (CELParseError, lark's)
        raise CelSpecError(_syntax(str(exc), type(exc).__name__)) from None
    unknown = sorted(undeclared(tree))
    if unknown:
        refs = ", ".join(f"undeclared reference to {name!r}" for name in unknown)
        raise CelSpecError(f"{refs}; the declared variables are {declared()}")
    return env.program(tree)


def undeclared(tree: Tree[Any], bound: frozenset[str] = frozenset()) -> set[str]:
    """The identifiers ``tree`` reads that are neither declared, bound by a macro around them, nor a type name."""
    if tree.data in ("ident", "dot_ident"):
        name = str(tree.children[0])
        return set() if name in VARIABLES or name in bound or name in _TYPE_NAMES else {name}
    if tree.data == "member_object":  # a message's type name, then its fields' values
        return set().union(*(undeclared(c, bound) for c in tree.children[1:] if isinstance(c, Tree)))
    if tree.data == "member_dot_arg" and str(tree.children[1]) in _MACROS:
        target, _method, args = tree.children
        exprs = [c for c in args.children if isinstance(c, Tree)] if isinstance(args, Tree) else []
        variable = _bare_ident(exprs[0]) if exprs else None
        found = undeclared(target, bound) if isinstance(target, Tree) else set()
        inner = bound | {variable} if variable else bound
        for expr in exprs[1 if variable else 0:]:
            found |= undeclared(expr, inner)
        return found
    return set().union(*(undeclared(c, bound) for c in tree.children if isinstance(c, Tree)))


def _bare_ident(tree: Tree[Any]) -> str | None:
    """The name when ``tree`` is nothing but one identifier (a macro's variable)."""
    node: Any = tree
    while isinstance(node, Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "ident" and isinstance(node.children[0], Token):
        return str(node.children[0])
    return None


def _syntax(text: str, fallback: str) -> str:
    """cel-python's parse error (the expression's line, then a caret under the column) as one line."""
    lines = text.rstrip().splitlines()
    if len(lines) >= 2 and lines[1].strip() == "^":
        return _bounded(f"a syntax error at column {lines[1].index('^') + 1} of {lines[0].strip()!r}")
    return _bounded(lines[0] if lines else fallback)


def problem(exc: BaseException) -> str:
    """An evaluation error in one short line: cel-python's sentence without the activation it appends, and the cause's
    own words; for an operator applied to errors (``a && b`` with both failing), the first of those errors. Never the
    repr of its objects."""
    args: tuple[Any, ...] = exc.args
    head = args[0] if args and isinstance(args[0], str) else type(exc).__name__
    if "CELEvalError" in head:
        inner = [p for p in _inner_errors(str(exc)) if "overload" not in p]
        if inner:
            return _bounded(inner[0])
    head = head.split(" (in activation", 1)[0]
    detail = args[2] if len(args) > 2 and isinstance(args[2], tuple) else ()
    words = [d for d in detail if isinstance(d, str) and d not in head and "CELEvalError" not in d]
    return _bounded(_REPRS.sub(lambda m: m.group(1) or m.group(2), ": ".join([head, *words])))


#: A class's repr (``<class 'celpy.celtypes.IntType'>``) and a parser token's (``Token('RULE', 'relation_eq')``),
#: shown by their names.
_REPRS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>|Token\('\w+', '(\w+)'\)")


def _inner_errors(text: str) -> list[str]:
    """The sentences of the errors nested in an error's text (cel-python nests their reprs, quotes escaped at each
    level)."""
    found = []
    for part in text.split("CELEvalError(*(")[1:]:
        sentence = part.split(", <class", 1)[0].replace("\\", "")
        if sentence[:1] in ("'", '"'):  # the quotes around the sentence, not those inside it
            sentence = sentence[1:-1] if sentence.endswith(sentence[0]) else sentence[1:]
        found.append(sentence.split(" (in activation", 1)[0])
    return found


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM else text[:_MAX_PROBLEM - 1] + "…"
