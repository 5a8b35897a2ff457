"""The committed decoder schemas (ichord/render/schema/*.json) are what the pinned machinery says today.

tools/talos-oracle/gen_schema.py writes them from each contract's oracle (its ``schema`` case); a changed pin,
a changed probe list (ichord.render.strict.PROBES) or a hand edit makes this fail until they are regenerated:
    .venv/bin/python tools/talos-oracle/gen_schema.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.real import tools

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
ORACLES = {"v1.13": "talos-oracle-v1.13", "v1.14": "talos-oracle-v1.14"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_schema", ROOT / "tools" / "talos-oracle" / "gen_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("contract", [
    pytest.param(c, marks=pytest.mark.skipif(tools.missing(o) is not None, reason=tools.missing(o) or ""))
    for c, o in ORACLES.items()])
def test_the_committed_schema_is_current(contract: str) -> None:
    binary = tools.tool(ORACLES[contract])
    assert binary is not None
    text = _generator().generate(binary, contract)
    committed = (ROOT / "ichord" / "render" / "schema" / f"{contract}.json").read_text()
    assert text == committed, (f"ichord/render/schema/{contract}.json is not what {binary.name} says; regenerate it: "
                               ".venv/bin/python tools/talos-oracle/gen_schema.py")
