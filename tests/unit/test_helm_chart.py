"""The Helm chart (helm/ichord): what can be checked without helm, and `helm template` when it is installed.

Without helm the templates are checked structurally: blocks balanced, every ``.Values`` path they
read defined in values.yaml, and the YAML around the template actions well formed (actions that
fill a whole line are dropped, inline ones replaced by a placeholder); values.yaml against
values.schema.json; the generated README. With helm (PATH, $ICHORD_HELM or the tools build) every
template renders under several value sets and the rendered objects are checked. The RBAC rules
are checked against the daemon's recorded requests in tests/e2e/test_deploy_daemon.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ichord import yamlio
from ichord.kube import crds as kube_crds
from ichord.metrics import REGISTRY
from ichord.watchers.state_metrics import StateCollector
from tests._helm import find_helm, render
from tests.real import tools

CHART = Path(__file__).resolve().parents[2] / "helm" / "ichord"
TEMPLATES = [*sorted((CHART / "templates").glob("*.yaml")), CHART / "templates" / "_helpers.tpl"]
METRIC = "ichord_certificate_expiry_timestamp_seconds"

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



# -- values and their schema (no helm needed) -----------------------------------------------------

def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def test_the_values_are_valid_and_the_schema_refuses_unknown_keys() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    v = values()
    jsonschema.validate(v, schema())
    for path in (("bogus",), ("crds", "bogus"), ("prometheus", "rules", "bogus"), ("probes", "startup", "bogus"),
                 ("rbac", "bogus")):
        bad = copy.deepcopy(v)
        node = bad
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = 1
        with pytest.raises(jsonschema.ValidationError, match="Additional properties are not allowed"):
            jsonschema.validate(bad, schema())
    for bound in ("0%", "101%", "4", 0, "a quarter"):  # controller.maxUnavailable as the daemon's flag takes it
        bad_bound = copy.deepcopy(v)
        bad_bound["controller"]["maxUnavailable"] = bound
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad_bound, schema())
    for bound in ("10%", "100%", 3):
        good = copy.deepcopy(v)
        good["controller"]["maxUnavailable"] = bound
        jsonschema.validate(good, schema())
    wrong = copy.deepcopy(v)
    wrong["podAntiAffinity"] = "sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema())


def _leaves(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [p for k, v in node.items() for p in _leaves(v, f"{path}.{k}" if path else k)]
    return [path]


@pytest.mark.parametrize(("value", "expected"), [
    ("controller.maxUnavailable=0", "at '/controller/maxUnavailable': minimum: got 0, want 1"),
    ("controller.maxUnavailable=150%", "at '/controller/maxUnavailable': '150%' does not match pattern"),
    ("controller.certificateExpiryWarningDays=-3", "at '/controller/certificateExpiryWarningDays': minimum: got -3"),
    ("podDisruptionBudget.minAvailable=x", "at '/podDisruptionBudget/minAvailable': 'x' does not match pattern"),
])
def test_helm_names_the_rule_a_bad_number_or_percentage_breaks(value: str, expected: str) -> None:
    """A bad maxUnavailable (or PDB minAvailable) fails with the rule it breaks, not only "'oneOf' failed":
    one if/then/else per value (integer: its minimum; string: its pattern), each branch described."""
    helm = find_helm()
    if helm is None:
        pytest.skip("no helm: build it with scripts/tools.sh or set ICHORD_HELM")
    proc = subprocess.run([helm, "lint", str(CHART), "--set", value], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr
    assert "oneOf" not in proc.stdout + proc.stderr


def test_every_value_is_documented_and_the_readme_is_generated_from_them() -> None:
    sys.path.insert(0, str(CHART.parents[1] / "scripts"))
    try:
        import chart_readme
    finally:
        sys.path.pop(0)
    documented = {key for key, _ in chart_readme.documented((CHART / "values.yaml").read_text())}
    undocumented = [leaf for leaf in _leaves(values())
                    if not any(leaf == d or leaf.startswith(d + ".") for d in documented)]
    assert undocumented == []
    result = subprocess.run([sys.executable, str(CHART.parents[1] / "scripts" / "chart_readme.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_the_alert_rules_read_metrics_the_daemon_registers() -> None:
    text = template("prometheusrule.yaml")
    registered = {m.name for m in REGISTRY.collect()} | {f"{m.name}_total" for m in REGISTRY.collect()}
    registered |= {m.name for m in StateCollector.families()}  # registered by each running daemon (its informers)
    used = set(re.findall(r"\b(ichord?_[a-z_]+)\{", text)) | set(re.findall(r"\b(ichord?_[a-z_]+) ", text))
    assert used and used <= registered, used - registered


# -- rendered with helm ----------------------------------------------------------------------------

needs_helm = pytest.mark.skipif(find_helm() is None, reason="helm is not installed (PATH, $ICHORD_HELM or "
                                "~/.cache/ichord/tools/*/bin): the chart is checked structurally above, not rendered")

VALUE_SETS = {
    "defaults": [],
    "everything-on": ["--set", "prometheus.rules.enabled=true", "--set", "prometheus.serviceMonitor.enabled=true",
                      "--set", "prometheus.serviceMonitor.namespace=monitoring",
                      "--set", "prometheus.serviceMonitor.labels.release=kps", "--set", "commonLabels.team=platform",
                      "--set", "rbac.clusterLockNames={a,b}", "--set", "podAntiAffinity=soft",
                      "--set", "topologySpreadConstraints[0].maxSkew=1",
                      "--set", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
                      "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway"],
    "minimal": ["--set", "crds.enabled=false", "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                "--set", "replicaCount=1", "--set", "podAntiAffinity=none", "--set", "crds.keep=false"],
    "overrides": ["--set", "nameOverride=tc", "--set", "fullnameOverride=talos-ops", "--set", "crds.keep=false"],
}


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@needs_helm
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_template_renders(name: str) -> None:
    docs = render(*VALUE_SETS[name])
    kinds = by_kind(docs)
    assert "Deployment" in kinds and "Service" in kinds
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm" and labels["app.kubernetes.io/component"]
        if name == "everything-on":
            assert labels["team"] == "platform"
    if name == "minimal":
        assert not ({"CustomResourceDefinition", "Role", "ClusterRole", "ServiceAccount", "PodDisruptionBudget"}
                    & set(kinds))
    if name == "overrides":
        assert {d["metadata"]["name"] for d in docs if d["kind"] != "CustomResourceDefinition"} == {"talos-ops"}
        assert kinds["Deployment"][0]["metadata"]["labels"]["app.kubernetes.io/name"] == "tc"


@needs_helm
def test_helm_refuses_unknown_values() -> None:
    with pytest.raises(subprocess.CalledProcessError) as err:
        render("--set", "replicas=3")
    # helm 3.16 and later word it differently ("Additional property replicas", "additional properties 'replicas'").
    refusal = re.search(r"(?i)additional propert(y|ies) '?replicas'? (is )?not allowed", err.value.stderr)
    assert refusal, err.value.stderr


@needs_helm
def test_the_crds_are_the_files_kubectl_applies() -> None:
    files = {doc["metadata"]["name"]: doc for path in sorted((CHART / "files" / "crds").glob("*.yaml"))
             for doc in [yamlio.load(path.read_text())]}
    rendered = {d["metadata"]["name"]: d for d in render() if d["kind"] == "CustomResourceDefinition"}
    assert set(rendered) == set(files) == {f"{p}.{kube_crds.GROUP}" for p in ("talosclusters", "talosmachines",
                                                                               "talosoperations")}
    for name, crd in rendered.items():
        assert crd["spec"] == files[name]["spec"]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/component"] == "crd"
    unkept = [d for d in render("--set", "crds.keep=false") if d["kind"] == "CustomResourceDefinition"]
    assert unkept and all("annotations" not in d["metadata"] for d in unkept)


@needs_helm
def test_the_deployment_runs_ichord_safely_on_separate_nodes() -> None:
    (deployment,) = by_kind(render("--set", "prometheus.rules.certificateExpiryDays=30"))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["ichord"] and container["args"][0] == "run"
    assert "--certificate-expiry-warning-days=30" in container["args"]
    assert "--max-unavailable=25%" in container["args"]  # controller.maxUnavailable, the daemon's default bound
    assert container["image"] == f"ghcr.io/maesh/ichord:{yamlio.load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
        assert container[probe]["timeoutSeconds"] >= 1
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"trust": "/var/run/ichord/trust", "tmp": "/tmp"}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "NODE_NAME": "spec.nodeName"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


@needs_helm
def test_the_service_monitor_and_the_alerts() -> None:
    kinds = by_kind(render(*VALUE_SETS["everything-on"]))
    (monitor,) = kinds["ServiceMonitor"]
    assert monitor["metadata"]["namespace"] == "monitoring" and monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ichord-system"]}
    assert monitor["spec"]["endpoints"][0]["scrapeTimeout"] == "10s"
    (rule,) = kinds["PrometheusRule"]
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"IchordCertificateExpiring", "IchordBundleBackupStale", "IchordCAClientsNotRestarted",
                           "IchordOperationPaused", "IchordOperationFailed", "IchordNoLeader"}
    assert alerts["IchordCertificateExpiring"]["expr"] == (
        "min by (namespace, name, certificate) (ichord_certificate_expiry_timestamp_seconds) - time() < 90 * 86400")
    assert "{{ $labels.certificate }}" in alerts["IchordCertificateExpiring"]["annotations"]["summary"]
    assert alerts["IchordBundleBackupStale"]["for"] == "24h"
    assert 'phase="Paused"' in alerts["IchordOperationPaused"]["expr"] and alerts["IchordOperationPaused"]["for"]
    assert 'phase="Failed"' in alerts["IchordOperationFailed"]["expr"]
    assert 'namespace="ichord-system"' in alerts["IchordNoLeader"]["expr"] and alerts["IchordNoLeader"]["for"] == "4m"
    assert all(a.get("for") for a in alerts.values()), [n for n, a in alerts.items() if not a.get("for")]


@needs_helm
@pytest.mark.skipif(tools.tool("promrules") is None,
                    reason="promrules is not built (scripts/tools.sh builds it from tools/promrules)")
def test_the_alert_rules_pass_prometheus_own_checks(tmp_path: Path) -> None:
    """The rendered PrometheusRule's groups through Prometheus's rule-file code (what `promtool check rules` runs:
    strict YAML, every expr parsed as PromQL, durations and templates checked) and every alert with a `for:`."""
    (rule,) = by_kind(render(*VALUE_SETS["everything-on"]))["PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yamlio.dump(rule["spec"]))
    promrules = tools.tool("promrules")
    assert promrules is not None
    out = subprocess.run([str(promrules), str(path)], capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 group(s), 6 alert(s)" in out.stdout, out.stdout
    # And it can fail: an alert without for: and an expression that does not parse are both refused.
    broken = yamlio.load(yamlio.dump(rule["spec"]))
    broken["groups"][0]["rules"][0].pop("for")
    broken["groups"][1]["rules"][0]["expr"] = "max by (namespace (ichord_operation_info"
    path.write_text(yamlio.dump(broken))
    out = subprocess.run([str(promrules), str(path)], capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 1 and "no for: clause" in out.stdout and "parse error" in out.stdout, out.stdout


@needs_helm
def test_helm_lint() -> None:
    helm = find_helm()
    assert helm is not None
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0 and "0 chart(s) failed" in out.stdout, out.stdout + out.stderr


def _rules_for(doc: dict[str, Any], resource: str) -> list[dict[str, Any]]:
    return [r for r in doc.get("rules") or [] if resource in (r.get("resources") or [])]


@needs_helm
def test_watch_namespaces_grant_secrets_and_leases_per_namespace_and_the_daemon_watches_there() -> None:
    """Issue 27: where a TalosCluster's bundle Secret and lock Lease live (its own namespace), the chart grants them:
    a Role per served namespace, and the Deployment tells the daemon the same namespaces."""
    docs = render("--set", "watchNamespaces={team-a,team-b,ichord-system}")
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"ichord-system", "team-a", "team-b"}  # the release namespace once
    for ns in ("ichord-system", "team-a", "team-b"):
        assert [r["verbs"] for r in _rules_for(roles[ns], "secrets")] == [["get", "list", "watch", "update"],
                                                                         ["create", "delete"]]  # + key custody
        locks = [r for r in _rules_for(roles[ns], "leases") if r.get("resourceNames") != ["ichord-leader"]]
        assert sorted(v for r in locks for v in r["verbs"]) == ["create", "get", "update"]
        assert bindings[ns]["subjects"] == [{"kind": "ServiceAccount", "name": "ichord", "namespace": "ichord-system"}]
    leader = [r for r in _rules_for(roles["ichord-system"], "leases") if r.get("resourceNames") == ["ichord-leader"]]
    assert leader and not [r for r in _rules_for(roles["team-a"], "leases") if "ichord-leader" in
                           (r.get("resourceNames") or [])]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert not _rules_for(cluster_role, "secrets") and not _rules_for(cluster_role, "leases")
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--watch-namespace")] == [
        "--watch-namespace=team-a", "--watch-namespace=team-b", "--watch-namespace=ichord-system"]
    locked = render("--set", "watchNamespaces={team-a}", "--set", "rbac.clusterLockNames={demo}")
    team_a = next(d for d in locked if d["kind"] == "Role" and d["metadata"]["namespace"] == "team-a")
    locks = [r.get("resourceNames") for r in _rules_for(team_a, "leases") if "get" in r["verbs"]]
    assert locks == [["ichord-lock-demo"], ["ichor-lock-demo"]]  # the name before the rename: get only


@needs_helm
def test_watch_all_namespaces_grants_secrets_and_leases_cluster_wide() -> None:
    docs = render("--set", "watchAllNamespaces=true", "--set", "watchNamespaces={team-a}")
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"} == {"ichord-system"}
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert [r["verbs"] for r in _rules_for(cluster_role, "secrets")] == [["get", "list", "watch", "update"],
                                                                     ["create", "delete"]]  # + key custody
    assert sorted(v for r in _rules_for(cluster_role, "leases") for v in r["verbs"]) == ["create", "get", "update"]
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--watch-namespace")]
