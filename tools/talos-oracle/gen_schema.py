"""Write ichord/render/schema/v1.13.json and v1.14.json: Talos's configuration decoder per contract.

    .venv/bin/python tools/talos-oracle/gen_schema.py [--bin DIR] [--check]

Each file is what the contract's oracle (talos-oracle-v1.13, -v1.14: machinery v1.13.9, v1.14.1, built by
scripts/tools.sh) answers to a ``schema`` case (schema.go): every registered document kind's Go type as
Talos's decoder walks it, and which of ichord's probe values (ichord.render.strict.PROBES, encoded as ichord
encodes values) each type decodes. A generated artifact: never edit the files by hand; regenerate them when
a pin in tools/talos-oracle changes (tests/real/test_talos_schema.py fails until then). --check compares
instead of writing (exit 1 when a file is not current). The binaries are found in --bin, else
$ICHORD_TOOLS_BIN, else scripts/tools.sh --print-bin.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ichord.render import wire  # noqa: E402
from ichord.render.strict import PROBES  # noqa: E402

CONTRACTS = {"v1.13": "talos-oracle-v1.13", "v1.14": "talos-oracle-v1.14"}
OUT = ROOT / "ichord" / "render" / "schema"
_PREFIX = "github.com/siderolabs/talos/pkg/machinery/"


def probe_texts() -> dict[str, str]:
    return {name: wire.encode([value]).decode() for name, value in PROBES.items()}


def _short(type_id: str) -> str:
    return type_id.replace(_PREFIX, "machinery/")


def generate(binary: Path, contract: str) -> str:
    """The schema file's text for ``contract``, from its oracle ``binary``."""
    request = {"cases": [{"id": "schema", "schema": {"probes": probe_texts()}}]}
    run = subprocess.run([str(binary)], input=json.dumps(request), capture_output=True, text=True,  # noqa: S603
                         check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{binary.name} failed: {run.stderr.strip()}")
    (answer,) = json.loads(run.stdout)
    if answer.get("error"):
        raise RuntimeError(f"{binary.name}: {answer['error']}")
    schema: dict[str, Any] = answer["schema"]

    def fix(t: dict[str, Any]) -> dict[str, Any]:
        out = dict(t)
        if "fields" in out:
            out["fields"] = {k: _short(v) for k, v in sorted(out["fields"].items())}
        for key in ("elem", "open"):
            if key in out:
                out[key] = _short(out[key])
        return out

    data = {
        "generated": f"by tools/talos-oracle/gen_schema.py from {CONTRACTS[contract]}; do not edit",
        "contract": contract,
        "documents": {k: {**v, "type": _short(v["type"])} for k, v in sorted(schema["documents"].items())},
        "types": {_short(k): fix(v) for k, v in sorted(schema["types"].items())},
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def bin_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("ICHORD_TOOLS_BIN"):
        return Path(os.environ["ICHORD_TOOLS_BIN"])
    out = subprocess.run([str(ROOT / "scripts" / "tools.sh"), "--print-bin"], capture_output=True, text=True,  # noqa: S603
                         check=True)
    return Path(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", help="the directory holding talos-oracle-v1.13 and talos-oracle-v1.14")
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args()
    directory = bin_dir(args.bin)
    stale = []
    for contract, name in CONTRACTS.items():
        text = generate(directory / name, contract)
        path = OUT / f"{contract}.json"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)} ({len(text)} bytes)")
    if stale:
        print(f"not current: {', '.join(stale)}; run tools/talos-oracle/gen_schema.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
