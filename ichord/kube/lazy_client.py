"""kubernetes-asyncio's packages with their names loaded on first use, not all at import.

``import kubernetes_asyncio`` runs ``client/__init__.py``, which imports every generated model (~770
modules) and API (~65): ~47 MB of resident memory in a daemon that uses five APIs and a few models.
``install()`` registers stand-ins for the four packages whose ``__init__`` only re-exports names
(``kubernetes_asyncio``, ``.client``, ``.client.api``, ``.client.models``) before anything imports them:
real package modules (the real ``__path__``, spec and file) whose ``__init__`` is not run; a PEP 562
module ``__getattr__`` imports the one submodule that defines a name when the name is first asked for.
Every name the real packages export resolves to the object its submodule defines, and any submodule
(``client.rest``, ``config``, ``watch``, ...) still imports as an attribute or by name.

The names come from the real ``__init__`` files, so a new release's models come along. A file holding
anything but such re-exports, ``__all__``, ``__version__`` and a docstring is not the layout this was
written against: then nothing is installed and the normal import runs (the saving is lost, nothing breaks).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ROOT = "kubernetes_asyncio"
#: The packages whose ``__init__`` only re-exports their submodules' names, parents first.
PACKAGES = (ROOT, f"{ROOT}.client", f"{ROOT}.client.api", f"{ROOT}.client.models")
_CONSTANTS = frozenset({"__all__", "__version__", "__project__"})


class UnexpectedLayout(Exception):
    """A package's ``__init__`` does more than re-export names: the lazy stand-in would not be faithful."""


@dataclass(frozen=True)
class Export:
    """Where a package's public name comes from: ``attr`` of ``module`` (None: the module itself)."""

    module: str
    attr: str | None


@dataclass(frozen=True)
class Plan:
    """One package's stand-in: its spec (not executed), its exports and its literal constants."""

    spec: importlib.machinery.ModuleSpec
    exports: dict[str, Export]
    constants: dict[str, Any]


def install() -> bool:
    """Register the lazy packages; False (and nothing changed) when already imported or not as expected."""
    if any(name in sys.modules for name in PACKAGES):
        return False  # too late to be faithful: keep whatever is loaded
    try:
        plans = _plans()
    except (UnexpectedLayout, OSError, SyntaxError, UnicodeDecodeError):
        return False
    if plans is None:
        return False
    modules = [_module(name, plan) for name, plan in zip(PACKAGES, plans, strict=True)]
    for name, module in zip(PACKAGES, modules, strict=True):
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)  # what the import system sets after a real import
    return True


def _plans() -> list[Plan] | None:
    """Each package's plan, found on sys.path without importing anything (None: kubernetes-asyncio is absent)."""
    plans: list[Plan] = []
    paths: dict[str, list[str] | None] = {"": None}  # a package's search path, by name (sys.path at the top)
    for name in PACKAGES:
        spec = importlib.machinery.PathFinder.find_spec(name, paths[name.rpartition(".")[0]])
        if spec is None or spec.origin is None or spec.submodule_search_locations is None:
            return None
        if not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            raise UnexpectedLayout(f"{name} is not loaded from a source file")
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        plans.append(Plan(spec, *parse_init(name, source)))
        paths[name] = list(spec.submodule_search_locations)
    return plans


def parse_init(package: str, source: str) -> tuple[dict[str, Export], dict[str, Any]]:
    """The names a package's ``__init__`` re-exports and its literal constants; UnexpectedLayout otherwise."""
    exports: dict[str, Export] = {}
    constants: dict[str, Any] = {}
    below = package + "."
    for i, node in enumerate(ast.parse(source).body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(below):
            for alias in node.names:
                if alias.name == "*":
                    raise UnexpectedLayout(f"{package} re-exports * from {node.module}")
                exports[alias.asname or alias.name] = Export(str(node.module), alias.name)
        elif isinstance(node, ast.Import) and all(a.name.startswith(below) and a.asname for a in node.names):
            for alias in node.names:  # ``import pkg.sub as sub``
                exports[str(alias.asname)] = Export(alias.name, None)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id in _CONSTANTS):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise UnexpectedLayout(f"{package}'s {node.targets[0].id} is not a literal") from None
        else:
            raise UnexpectedLayout(f"{package}'s __init__ has a statement other than re-exports (line {node.lineno})")
    return exports, constants


def _module(name: str, plan: Plan) -> ModuleType:
    """The package module from its real spec, its ``__init__`` replaced by exports resolved on demand."""
    module = importlib.util.module_from_spec(plan.spec)
    module.__dict__.update(plan.constants)
    exports = plan.exports

    def __getattr__(attr: str) -> Any:  # PEP 562
        export = exports.get(attr)
        if export is None:
            return _submodule(name, attr)
        owner = importlib.import_module(export.module)
        value = owner if export.attr is None else getattr(owner, export.attr)
        setattr(module, attr, value)  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(exports))

    module.__dict__.update(__getattr__=__getattr__, __dir__=__dir__)
    return module


def _submodule(package: str, attr: str) -> ModuleType:
    """A submodule no ``__init__`` line names (``client.rest``), imported as the real package's imports left it."""
    missing = AttributeError(f"module {package!r} has no attribute {attr!r}")
    if attr.startswith("__"):
        raise missing  # dunder probes (copy, pickle, inspect) never name a submodule
    full = f"{package}.{attr}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        raise missing from None
