"""ichord.kube.lazy_client: the daemon loads few generated models, and every name the packages export resolves.

Each check runs in a fresh interpreter: the lazy packages are installed once per process, before anything
imports kubernetes_asyncio, which this test process has long done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ichord.kube.lazy_client import UnexpectedLayout, parse_init

#: What ``ichord run`` imports (cli.main builds every subcommand's parser before running one).
DAEMON_IMPORTS = "import ichord.cli; ichord.cli.build_parser()"

#: Every name the real __init__ files bind, parsed here independently of lazy_client, compared with what
#: the lazy package returns; then ``__all__``, ``import *`` and the subpackages the real top-level imports.
RESOLVE = textwrap.dedent("""
    import ast, importlib, json, sys
    PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.api",
                "kubernetes_asyncio.client.models")
    lazy = all("__getattr__" in vars(sys.modules[p]) for p in PACKAGES)
    models = sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models."))
    wrong, checked = [], 0
    for name in PACKAGES:
        pkg = sys.modules[name]
        exported = []
        for node in ast.parse(open(pkg.__file__).read()).body:
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                pairs = [(a.asname or a.name, getattr(importlib.import_module(node.module), a.name))
                         for a in node.names]
            elif isinstance(node, ast.Import):
                pairs = [(a.asname, importlib.import_module(a.name)) for a in node.names]
            elif isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
                exported = ast.literal_eval(node.value)
                continue
            else:
                continue
            for attr, real in pairs:
                checked += 1
                if getattr(pkg, attr) is not real:
                    wrong.append(f"{name}.{attr}")
        wrong += [f"{name}.{a} (in __all__)" for a in exported if not hasattr(pkg, a)]
        star = {}
        exec(f"from {name} import *", star)
        wrong += [f"{name}.{a} (import *)" for a in exported if a not in star]
    import kubernetes_asyncio as ka
    import kubernetes_asyncio.watch
    from kubernetes_asyncio import config, dynamic, stream, utils
    from kubernetes_asyncio.client import rest
    extras = [ka.config.load_kube_config, ka.config.kube_config.KubeConfigLoader, ka.watch.Watch,
              ka.utils.create_from_yaml, ka.dynamic.DynamicClient, ka.stream.WsApiClient,
              ka.client.rest.RESTClientObject, ka.client.api_client.ApiClient, ka.__version__,
              ka.client.models.V1Lease.openapi_types]
    print(json.dumps({"lazy": lazy, "models": models, "checked": checked, "wrong": wrong}))
""")


def _python(code: str, *, path: Path | None = None) -> dict[str, object]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_daemon_loads_few_models_and_every_exported_name_resolves() -> None:
    got = _python(DAEMON_IMPORTS + "\n" + RESOLVE)
    assert got["lazy"] is True
    assert isinstance(got["models"], list) and len(got["models"]) < 60, got["models"]  # of ~770
    assert isinstance(got["checked"], int) and got["checked"] > 700  # the models' and APIs' names were seen
    assert got["wrong"] == []


def _fake_package(root: Path, client_init: str) -> Path:
    """A kubernetes_asyncio with the real layout: an eager top level, client, client.api, client.models."""
    pkg = root / "kubernetes_asyncio"
    for sub in ("client/api", "client/models"):
        (pkg / sub).mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Fake."""\n__version__ = "1.0"\nimport kubernetes_asyncio.client as client\n')
    (pkg / "client" / "__init__.py").write_text(client_init)
    (pkg / "client" / "greeting.py").write_text("import sys\nGREETING = 'hello'\nsys.modules[__name__].loaded = 1\n")
    (pkg / "client" / "api" / "__init__.py").write_text("")
    (pkg / "client" / "models" / "__init__.py").write_text("from __future__ import absolute_import\n")
    return root


PROBE = textwrap.dedent("""
    import json, sys
    import ichord.kube
    import kubernetes_asyncio
    client = sys.modules["kubernetes_asyncio.client"]
    before = "kubernetes_asyncio.client.greeting" in sys.modules
    print(json.dumps({"lazy": "__getattr__" in vars(client), "loaded_at_import": before,
                      "greeting": kubernetes_asyncio.client.GREETING, "version": kubernetes_asyncio.__version__}))
""")


def test_a_package_laid_out_as_expected_loads_a_name_when_asked(tmp_path: Path) -> None:
    root = _fake_package(tmp_path, "from kubernetes_asyncio.client.greeting import GREETING\n__all__ = ['GREETING']\n")
    got = _python(PROBE, path=root)
    assert got == {"lazy": True, "loaded_at_import": False, "greeting": "hello", "version": "1.0"}


def test_an_init_doing_more_than_re_exports_keeps_the_normal_import(tmp_path: Path) -> None:
    # A later release whose client/__init__ configures something: the stand-in would skip that, so none is used.
    root = _fake_package(tmp_path, "from kubernetes_asyncio.client.greeting import GREETING\nGREETING += '!'\n")
    got = _python(PROBE, path=root)
    assert got == {"lazy": False, "loaded_at_import": True, "greeting": "hello!", "version": "1.0"}


@pytest.mark.parametrize("source", [
    "from kubernetes_asyncio.client.x import *\n",
    "import os\n",
    "from six import moves\n",
    "import kubernetes_asyncio.client.x\n",  # binds kubernetes_asyncio, not a name of this package
    "if True:\n    from kubernetes_asyncio.client.x import X\n",
    "__all__ = sorted(['X'])\n",
])
def test_statements_other_than_re_exports_are_unexpected(source: str) -> None:
    with pytest.raises(UnexpectedLayout):
        parse_init("kubernetes_asyncio.client", source)


def test_re_exports_and_constants_are_read() -> None:
    exports, constants = parse_init("kubernetes_asyncio", textwrap.dedent('''
        """Doc."""
        from __future__ import absolute_import
        __version__ = "36.1.0"
        import kubernetes_asyncio.client as client
        from kubernetes_asyncio.client.api_client import ApiClient as Client, Other
        __all__ = ["client", "Client"]
    '''))
    assert {k: (v.module, v.attr) for k, v in exports.items()} == {
        "client": ("kubernetes_asyncio.client", None),
        "Client": ("kubernetes_asyncio.client.api_client", "ApiClient"),
        "Other": ("kubernetes_asyncio.client.api_client", "Other"),
    }
    assert constants == {"__version__": "36.1.0", "__all__": ["client", "Client"]}
