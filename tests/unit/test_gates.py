"""Health gates (ichord/operations/gates.py): the policy's validation and each gate type's verdict, over a fake probe
(a pure unit; the integration and real tiers ask the simulators and a real Prometheus)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import pytest

from ichord.operations import gates
from ichord.operations.gates import Gate, GateSpecError, Record, Verdict, evaluate, policy_of

pytestmark = pytest.mark.anyio

READY = 'nodes.all(n, n.status.conditions.exists(c, c.type == "Ready" && c.status == "True"))'


def node(name: str, ready: str = "True") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}


class FakeProbe:
    def __init__(self, nodes: list[dict[str, Any]] | None = None, answers: dict[str, Any] | None = None) -> None:
        self._nodes = nodes or []
        self.answers = answers or {}
        self.asked: list[tuple[str, list[tuple[str, str]]]] = []
        self.trusts: list[str] = []

    async def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    async def get_json(self, url: str, params: Sequence[tuple[str, str]], *, trust: str = "") -> Any:
        self.asked.append((url, list(params)))
        self.trusts.append(trust)
        answer = self.answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer


def cluster(health: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"health": health}}


def test_policy_joins_cluster_and_operation_gates_and_takes_the_longest_soak() -> None:
    op = {"spec": {"health": {"gates": [{"name": "settle", "delay": {"duration": "15m"}}]}}}
    policy = policy_of(cluster({"soak": "10m", "gates": [{"name": "ready", "cel": {"expression": READY}}]}), op)
    assert [g.name for g in policy.gates] == ["ready", "settle"]
    assert policy.soak == 900.0
    assert policy_of(cluster({"soak": "10m"}), {}, scale=0.01).soak == pytest.approx(6.0)


def test_operation_soak_replaces_the_clusters_and_accepted_spec_wins() -> None:
    op = {"spec": {"health": {"soak": "1h"}}, "status": {"acceptedSpec": {"health": {"soak": "2m"}}}}
    assert policy_of(cluster({"soak": "10m"}), op).soak == 120.0
    assert policy_of(cluster({"soak": "10m"}), {"spec": {"health": {"soak": "0s"}}}).empty


@pytest.mark.parametrize(("gate", "says"), [
    ({"name": "Bad_Name", "delay": {"duration": "1m"}}, "lowercase DNS label"),
    ({"name": "two", "delay": {"duration": "1m"}, "cel": {"expression": "true"}}, "exactly one of"),
    ({"name": "none"}, "it sets none"),
    ({"name": "d", "delay": {"duration": "soon"}}, "not a duration"),
    ({"name": "c", "cel": {"expression": "nodes.all(n, "}}, r"does not compile: a syntax error at column 12 of "
                                                            r"'nodes\.all\(n,'"),
    ({"name": "c", "cel": {"expression": "foo == 1"}}, r"health gate 'c': cel\.expression does not compile: "
                                                       r"undeclared reference to 'foo'; the declared variables are "
                                                       r"nodes \(the managed cluster's Nodes"),
    ({"name": "c", "cel": {"expression": "nodes.all(n, m.ready)"}}, "undeclared reference to 'm'"),
    ({"name": "c", "cel": {"expression": "[1].map(x, x + y)[0] == 1"}}, "undeclared reference to 'y'"),
    ({"name": "c", "cel": {"expression": "  "}}, "cel.expression is empty"),
    ({"name": "p", "prometheus": {"url": "prometheus:9090", "query": "up"}}, "http:// or https://"),
    ({"name": "p", "prometheus": {"url": "http://p:9090", "query": ""}}, "prometheus.query is empty"),
    ({"name": "p", "prometheus": {"url": "http://p:9090", "query": "up", "threshold": "1"}}, "must be a number"),
    ({"name": "a", "alertmanager": {"url": "http://a:9093", "matchers": []}}, "at least one matcher"),
    ({"name": "a", "alertmanager": {"url": "http://a:9093", "matchers": ["severity"]}}, "is not label=value"),
])
def test_bad_gates_are_refused_with_a_message_naming_them(gate: dict[str, Any], says: str) -> None:
    with pytest.raises(GateSpecError, match=says):
        policy_of(cluster({"gates": [gate]}), {})


@pytest.mark.parametrize("url", ["http://admin:hunter2@prometheus:9090", "https://token@prometheus",
                                 "http://admin:hunter2@prometheus:9090/?q=1"])
def test_a_gate_url_with_credentials_is_refused_without_repeating_them(url: str) -> None:
    with pytest.raises(GateSpecError, match="carries credentials") as refused:
        policy_of(cluster({"gates": [{"name": "p", "prometheus": {"url": url, "query": "up"}}]}), {})
    assert "hunter2" not in str(refused.value) and "token" not in str(refused.value)


def test_an_at_sign_outside_the_host_is_not_taken_for_credentials() -> None:
    gate = {"name": "p", "prometheus": {"url": "http://prometheus:9090/x?who=a@b", "query": "up"}}
    assert not policy_of(cluster({"gates": [gate]}), {}).empty


def test_two_gates_of_one_name_and_a_bad_soak_are_refused() -> None:
    with pytest.raises(GateSpecError, match="two health gates are named 'x'"):
        policy_of(cluster({"gates": [{"name": "x", "delay": {"duration": "1m"}}]}),
                  {"spec": {"health": {"gates": [{"name": "x", "delay": {"duration": "2m"}}]}}})
    with pytest.raises(GateSpecError, match=r"spec\.health\.soak"):
        policy_of(cluster({"soak": "ten minutes"}), {})


def _gate(raw: dict[str, Any]) -> Gate:
    return policy_of(cluster({"gates": [raw]}), {}).gates[0]


@pytest.mark.parametrize("expression", [
    'nodes.all(n, n.status.conditions.exists(c, c.type == "Ready"))', "nodes.exists(n, n.metadata.name == target)",
    "type(target) == string", "has(nodes[0].spec) || nodes.map(n, n.spec).filter(s, has(s.x)).size() == 0"])
def test_a_macro_s_own_variables_and_type_names_are_declared(expression: str) -> None:
    assert _gate({"name": "c", "cel": {"expression": expression}}).program is not None


@pytest.mark.parametrize(("expression", "says"), [
    ("nodes[0].nosuch == 1", "expression failed: no such member in mapping: 'nosuch'"),
    ("nodes[5] == 1", "expression failed: invalid_argument: list index out of range"),
    # Both sides failing: cel-python nests the first error's repr, activation and all, in the second's.
    ("nodes.all(n, n.spec.x) && nodes[0].spec.y", "expression failed: no such member in mapping: 'spec'"),
    ("nodes.map(n, n.metadata.name)[0] == 1", "expression failed: found no matching overload for relation_eq "
     "applied to '(StringType, IntType)': no such overload: IntType(1) IntType != StringType('a') StringType"),
])
async def test_an_expression_that_fails_says_why_in_one_short_line(expression: str, says: str) -> None:
    verdict = await evaluate(_gate({"name": "c", "cel": {"expression": expression}}), FakeProbe([node("a")]),
                             target="w1")
    assert (verdict.passing, verdict.message) == (False, says)


async def test_cel_over_node_conditions() -> None:
    gate = _gate({"name": "ready", "cel": {"expression": READY}})
    passed = await evaluate(gate, FakeProbe([node("a"), node("b")]), target="w1")
    failed = await evaluate(gate, FakeProbe([node("a"), node("b", "False")]), target="w1")
    assert passed == Verdict("ready", "cel", True, "expression is true")
    assert failed == Verdict("ready", "cel", False, "expression is false")


async def test_cel_sees_the_target_and_an_error_or_a_non_bool_fails() -> None:
    named = _gate({"name": "t", "cel": {"expression": 'target == "w2"'}})
    assert (await evaluate(named, FakeProbe(), target="w2")).passing
    assert not (await evaluate(named, FakeProbe(), target="w1")).passing
    missing = await evaluate(_gate({"name": "m", "cel": {"expression": "nodes[3].status.x"}}), FakeProbe(),
                             target="w1")
    assert not missing.passing and missing.message.startswith("expression failed")
    number = await evaluate(_gate({"name": "n", "cel": {"expression": "size(nodes)"}}), FakeProbe([node("a")]),
                            target="w1")
    assert not number.passing and "not a bool" in number.message


def _vector(*values: float) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"alertname": f"A{i}"}, "value": [0, str(v)]} for i, v in enumerate(values)]}}


async def test_prometheus_passes_on_empty_or_below_threshold() -> None:
    url = "http://prom:9090/api/v1/query"
    plain = _gate({"name": "p", "prometheus": {"url": "http://prom:9090/", "query": "ALERTS"}})
    probe = FakeProbe(answers={url: _vector()})
    assert (await evaluate(plain, probe, target="w")).passing
    assert probe.asked == [(url, [("query", "ALERTS")])]
    probe.answers[url] = _vector(1)
    firing = await evaluate(plain, probe, target="w")
    assert not firing.passing and 'alertname="A0"' in firing.message
    limited = _gate({"name": "p", "prometheus": {"url": "http://prom:9090", "query": "x", "threshold": 5}})
    probe.answers[url] = _vector(1, 4.5)
    assert (await evaluate(limited, probe, target="w")).passing
    probe.answers[url] = _vector(1, 5)
    over = await evaluate(limited, probe, target="w")
    assert not over.passing and "1 series at or above 5" in over.message
    probe.answers[url] = {"status": "success", "data": {"resultType": "scalar", "result": [0, "7"]}}
    assert not (await evaluate(limited, probe, target="w")).passing


async def test_prometheus_errors_and_unreachable_fail_the_gate() -> None:
    url = "http://prom:9090/api/v1/query"
    gate = _gate({"name": "p", "prometheus": {"url": "http://prom:9090", "query": "up"}})
    for answer in ({"status": "error", "error": "parse error"}, OSError("connection refused"),
                   {"status": "success", "data": {"resultType": "matrix", "result": []}}):
        verdict = await evaluate(gate, FakeProbe(answers={url: answer}), target="w")
        assert not verdict.passing and verdict.message.startswith("cannot be asked"), verdict


async def test_alertmanager_passes_only_without_firing_matches() -> None:
    url = "http://am:9093/api/v2/alerts"
    gate = _gate({"name": "a", "alertmanager": {"url": "http://am:9093", "matchers": ["severity=critical",
                                                                                     'alertname=~"Node.*"']}})
    probe = FakeProbe(answers={url: []})
    assert (await evaluate(gate, probe, target="w")).passing
    assert probe.asked[0][1] == [("active", "true"), ("silenced", "false"), ("inhibited", "false"),
                                 ("filter", 'severity="critical"'), ("filter", 'alertname=~"Node.*"')]
    probe.answers[url] = [{"labels": {"alertname": "NodeDown"}, "status": {"state": "active"}}]
    verdict = await evaluate(gate, probe, target="w")
    assert not verdict.passing and "NodeDown" in verdict.message
    probe.answers[url] = [{"labels": {"alertname": "NodeDown"}, "status": {"state": "suppressed"}}]
    assert (await evaluate(gate, probe, target="w")).passing


def test_record_notes_which_gates_changed() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    first, changed = gates._recorded(Record(), [Verdict("a", "cel", True, "ok"), Verdict("b", "cel", False, "no")],
                                     "w1", None, now)
    assert [(v.name, was) for v, was in changed] == [("b", False)]  # a first pass is no news; a first failure is
    record = Record.of({gates.SECTION: first})
    later = now + dt.timedelta(minutes=1)
    second, changed = gates._recorded(record, [Verdict("a", "cel", True, "ok"), Verdict("b", "cel", True, "ok")],
                                      "w1", None, later)
    assert [(v.name, was) for v, was in changed] == [("b", True)]
    rows = {r["name"]: r for r in second["gates"]}
    assert rows["a"]["lastTransitionTime"] == first["gates"][0]["lastTransitionTime"]
    assert rows["b"]["lastTransitionTime"] != rows["a"]["lastTransitionTime"]


_CA_REF = {"configMapKeyRef": {"name": "monitoring-ca", "key": "ca.crt"}}


@pytest.mark.parametrize(("ca_bundle", "url", "says"), [
    ({}, "https://p:9090", "exactly one of configMapKeyRef, secretKeyRef (it sets none)"),
    ({**_CA_REF, "secretKeyRef": {"name": "s", "key": "k"}}, "https://p:9090", "it sets configMapKeyRef, secretKeyRef"),
    (_CA_REF, "http://p:9090", "the URL is not https://"),
    ({"configMapKeyRef": {"name": "Bad_Name", "key": "ca.crt"}}, "https://p:9090", "is not a ConfigMap name"),
    ({"secretKeyRef": {"name": "s", "key": "a/b"}}, "https://p:9090", "is not a key of a Secret's data"),
    ("monitoring-ca", "https://p:9090", "caBundle must be an object"),
])
def test_bad_ca_bundles_are_refused_naming_the_gate(ca_bundle: Any, url: str, says: str) -> None:
    gate = {"name": "p", "prometheus": {"url": url, "query": "up", "caBundle": ca_bundle}}
    with pytest.raises(GateSpecError, match=r"health gate 'p': prometheus\.caBundle") as refused:
        policy_of(cluster({"gates": [gate]}), {})
    assert says in str(refused.value)


async def test_the_resolved_bundle_is_what_the_gate_verifies_with() -> None:
    gate = {"name": "a", "alertmanager": {"url": "https://a:9093", "matchers": ["severity=critical"],
                                          "caBundle": {"secretKeyRef": {"name": "am-ca", "key": "ca.crt"}}}}
    (parsed,) = policy_of(cluster({"gates": [gate]}), {}).gates
    assert parsed.ca_bundle is not None and str(parsed.ca_bundle) == "Secret am-ca key ca.crt"
    probe = FakeProbe(answers={"https://a:9093/api/v2/alerts": []})
    resolved = dataclasses.replace(parsed, trust="PEM")
    assert (await evaluate(resolved, probe, target="n")).passing
    assert probe.trusts == ["PEM"]
