"""The Helm chart (helm/ichord): what can be checked without helm, and `helm template` when it is installed.

Without helm the templates are checked structurally: blocks balanced, every ``.Values`` path they
read defined in values.yaml, and the YAML around the template actions well formed (actions that
fill a whole line are dropped, inline ones replaced by a placeholder).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ichord import yamlio
from ichord.metrics import CERTIFICATE_EXPIRY
from tests.real import tools

CHART = Path(__file__).resolve().parents[2] / "helm" / "ichord"
TEMPLATES = [*sorted((CHART / "templates").glob("*.yaml")), CHART / "templates" / "_helpers.tpl"]
METRIC = "ichor_certificate_expiry_timestamp_seconds"

_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.DOTALL)
_RAW_STRING_ACTION = re.compile(r"\{\{-?\s*`[^`]*`\s*-?\}\}")
_ACTION = re.compile(r"\{\{-?.*?-?\}\}")
_OPENERS = re.compile(r"\{\{-?\s*(if|with|range|define)\b")
_ENDS = re.compile(r"\{\{-?\s*end\s*-?\}\}")


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yamlio.load((CHART / "values.yaml").read_text())
    return loaded


def template(name: str) -> str:
    return (CHART / "templates" / name).read_text()


def strip_actions(text: str) -> str:
    text = _RAW_STRING_ACTION.sub("PLACEHOLDER", _COMMENT.sub("", text))
    lines = []
    for line in text.splitlines():
        if line.strip() and not _ACTION.sub("", line).strip():
            continue  # a line that is only template actions
        lines.append(_ACTION.sub("PLACEHOLDER", line))
    return "\n".join(lines)


def test_chart_yaml() -> None:
    chart = yamlio.load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "ichord" and chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"]) and chart["appVersion"]


def test_values_parse_and_document_the_expiry_window() -> None:
    v = values()
    assert v["prometheus"]["rules"]["certificateExpiryDays"] == 90
    assert v["prometheus"]["rules"]["enabled"] is False
    text = (CHART / "values.yaml").read_text()
    block = text[text.index("rules:"):text.index("certificateExpiryDays:")]
    assert "--certificate-expiry-warning-days" in block and "equal" in block


def test_the_prometheus_rule_alerts_on_the_metric_within_the_window() -> None:
    text = template("prometheusrule.yaml")
    assert [m.name for m in CERTIFICATE_EXPIRY.describe()] == [METRIC]  # the metric the daemon publishes
    assert "{{- if .Values.prometheus.rules.enabled }}" in text
    assert "alert: IchorCertificateExpiring" in text
    expr = next(line for line in text.splitlines() if "expr:" in line)
    assert f"{METRIC} - time() < {{{{ .Values.prometheus.rules.certificateExpiryDays }}}} * 86400" in expr


def test_the_daemon_flag_defaults_to_the_alert_window() -> None:
    assert "--certificate-expiry-warning-days={{ include \"ichord.certificateExpiryWarningDays\" . }}" in template(
        "deployment.yaml")
    helper = (CHART / "templates" / "_helpers.tpl").read_text()
    assert ("default .Values.prometheus.rules.certificateExpiryDays .Values.controller.certificateExpiryWarningDays"
            in helper)


def test_the_deployment_mounts_the_trust_dir_and_sets_the_downward_api() -> None:
    doc = yamlio.load(strip_actions(template("deployment.yaml")))
    pod = doc["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["trust"] == "/var/run/ichor/trust"
    assert {"name": "trust", "emptyDir": {}} in pod["volumes"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "NODE_NAME": "spec.nodeName"}


def test_rbac_grants_what_the_daemon_uses() -> None:
    docs = [d for d in yamlio.load_all(strip_actions(template("clusterrole.yaml"))) if d]
    rules = docs[0]["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for need in [("ichor.maesh.dev", "talosclusters", "watch"), ("ichor.maesh.dev", "talosclusters/status", "patch"),
                 ("ichor.maesh.dev", "talosoperations/finalizers", "update"), ("", "events", "create"),
                 ("", "events", "patch"), ("", "pods/eviction", "create"), ("", "nodes", "get"),
                 ("", "configmaps", "get")]:
        assert need in granted, need
    assert not any("secrets" in r["resources"] or "leases" in r["resources"] for r in rules)
    role = next(d for d in yamlio.load_all(strip_actions(template("role.yaml"))) if d)
    ns_granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                  for v in rule["verbs"]}
    for need in [("", "secrets", "get"), ("", "secrets", "update"), ("coordination.k8s.io", "leases", "create"),
                 ("coordination.k8s.io", "leases", "update")]:
        assert need in ns_granted, need


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_every_template_is_balanced_and_reads_defined_values(path: Path) -> None:
    text = _COMMENT.sub("", path.read_text())
    assert text.count("{{") == text.count("}}")
    assert len(_OPENERS.findall(text)) == len(_ENDS.findall(text)), "an if/with/range without its end"
    v = values()
    for ref in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", text):
        node: Any = v
        for part in ref.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{ref} is not in values.yaml"
            node = node[part]
    if path.suffix == ".yaml":
        for doc in yamlio.load_all(strip_actions(text)):
            assert doc is None or isinstance(doc, dict)
    assert "\t" not in text


def helm_binary() -> str:
    """The helm scripts/tools.sh builds, else the machine's; skips when neither exists."""
    built = tools.tool("helm")
    helm = str(built) if built is not None else shutil.which("helm")
    if helm is None:
        pytest.skip(f"helm is not installed and {tools.missing('helm')}: the chart is checked structurally "
                    "above, not rendered")
    return helm


def test_helm_lint() -> None:
    out = subprocess.run([helm_binary(), "lint", str(CHART)], capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0 and "0 chart(s) failed" in out.stdout, out.stdout + out.stderr


def test_helm_template_renders_the_rule_and_the_flag(tmp_path: Path) -> None:
    helm = helm_binary()
    out = subprocess.run(
        [helm, "template", "ichord", str(CHART), "--namespace", "ichord-system",
         "--set", "prometheus.rules.enabled=true", "--set", "prometheus.rules.certificateExpiryDays=30",
         "--set", "prometheus.serviceMonitor.enabled=true"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    docs = {d["kind"]: d for d in yamlio.load_all(out) if d}
    rule = docs["PrometheusRule"]["spec"]["groups"][0]["rules"][0]
    assert rule["alert"] == "IchorCertificateExpiring" and rule["expr"] == f"{METRIC} - time() < 30 * 86400"
    assert "{{ $labels.certificate }}" in rule["annotations"]["summary"]
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--certificate-expiry-warning-days=30" in container["args"]
    assert {"ServiceMonitor", "PodDisruptionBudget", "ClusterRole", "Role", "Service"} <= set(docs)
