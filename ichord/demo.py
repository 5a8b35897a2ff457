"""``ichord demo``: the main job on an embedded default.

Until the daemon and the simulators run a whole cluster (later issues), the demo shows the ground
everything stands on: a fresh secrets bundle, the configuration of a control plane and a worker for
both contracts, and what each stage of a default CA rotation changes on them, classified the way
the machine reconciler will classify it. Plain progress lines, no input, exit 0 on success.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from ichord.api.carotation import Stage
from ichord.api.contract import SUPPORTED_CONTRACTS
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import bundle_fingerprint, ca_fingerprint
from ichord.pki.rotation import DEFAULT_TARGETS, generate_rotation
from ichord.render.fieldmeta import classify
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage

STAGES = (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run the demo on an embedded default")
    p.add_argument("--workdir", help="where to write the demo bundle (default: a temporary directory)")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ichord-demo-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        bundle = generate_bundle()
        path = workdir / "secrets.yaml"
        bundle.save(path, force=True)
        bundle = SecretsBundle.load(path)
        _say(
            f"bundle: generated in {time.perf_counter() - t0:.2f}s, saved to {path} (0600), "
            f"fingerprint {bundle_fingerprint(bundle)[:16]}…"
        )
        rotation = generate_rotation(DEFAULT_TARGETS)
        for t in rotation.targets:
            _say(
                f"rotation: new {t.value} CA {ca_fingerprint(rotation.new[t])[:16]}… "
                f"(old {ca_fingerprint(bundle.ca(t.ca_kind))[:16]}…)"
            )
        for contract in SUPPORTED_CONTRACTS:
            cluster = ClusterInputs.from_spec(
                "demo",
                {"endpoint": "https://demo.example:6443", "kubernetesVersion": "1.34.1", "talosVersion": str(contract)},
            )
            for role in ("controlplane", "worker"):
                machine = MachineInputs(role=role)
                base = render(bundle, cluster, machine)
                _say(f"render {contract} {role}: {len(base.documents)} documents, hash {base.hash()[:16]}…")
                previous = base
                for stage in STAGES:
                    staged = render_stage(bundle, rotation, stage, cluster, machine)
                    result = classify(previous, staged, contract, role)
                    paths = [c.path for c in result.changes]
                    _say(
                        f"  {stage.value:<10} {len(paths)} field(s) change, worst impact {result.worst.name}: "
                        + ", ".join(paths[:4])
                        + (" …" if len(paths) > 4 else "")
                    )
                    previous = staged
                final = render(rotation.apply_to(bundle), cluster, machine)
                same = final.to_bytes() == previous.to_bytes()
                _say(f"  Dropping == render of the replaced bundle: {'yes' if same else 'NO'}")
                if not same:
                    return 1
        _say("demo: done")
    return 0
