"""Health gates and soak: asked before each node of a rollout starts, and again after a soak time
(docs/decisions.md#health-gates). A CA rotation asks them the same way before each pass and each control plane of
its etcd reboot roll (ca_rotation/pass_gates.py, ca_rotation/etcd_roll.py): there ``target`` is the pass or machine.

The policy is the TalosCluster's ``spec.health`` plus the operation's own ``spec.health`` (its gates added to the
cluster's, its soak replacing the cluster's)::

    spec:
      health:
        soak: 10m                       # between two nodes: the gates must pass, then pass again this much later
        gates:
          - name: nodes-ready
            cel: {expression: 'nodes.all(n, n.status.conditions.exists(c, c.type == "Ready" && c.status == "True"))'}
          - name: no-critical-alerts
            alertmanager: {url: http://alertmanager:9093, matchers: ['severity="critical"']}
          - name: error-rate
            prometheus: {url: http://prometheus:9090, query: 'sum(rate(errors_total[5m]))', threshold: 1}
          - name: private-ca
            prometheus:
              url: https://prometheus.monitoring:9090
              query: 'up == 0'
              caBundle: {configMapKeyRef: {name: monitoring-ca, key: ca.crt}}   # or secretKeyRef
          - name: settle
            delay: {duration: 2m}       # a plain soak of its own

Before a node (the next machine of the plan, nothing under way), ``hold`` runs every gate:

    a gate fails (or cannot be asked)      -> Paused, reason GateFailing, the gate's name and message; re-asked every
                                              Timing.retry; a Warning GateFailing when a gate starts failing, a
                                              Normal GatePassed when it passes again; the node never skipped
    all pass, the plan's first node,       -> None: the caller starts the node
    or no soak and no delay gate
    all pass, soak not begun for this node -> soakStartedAt written; InProgress, reason Soaking; requeued at its end
    all pass, soak under way               -> InProgress Soaking; requeued at its end
    all pass, soak over                    -> None (the gates were asked again just now, after the soak)
    the policy is invalid                  -> Paused, reason InvalidHealthGates, nothing runs until it is fixed

Every verdict is in ``status.healthGates`` (the node it was asked for, when the soak began, per gate: passing,
message, when last asked, when it last changed). The record survives restarts and failover: a soak is measured
from the recorded ``soakStartedAt`` on the step's clock, never from the process's memory. Durations the user
declares (soak, delay) are scaled by ``ICHORD_TIME_SCALE`` like every duration of ``Timing``, so tests run them in
seconds.

An https:// gate verifies its server's certificate and name against the system's CAs, or, with ``caBundle``,
against the certificates of that bundle alone: a key of a ConfigMap or Secret in the TalosCluster's namespace
(a CA bundle is public: the spec names it, never holds it), read through ichord's client each time the gates
are asked. A reference that cannot be followed (no such object or key, no certificate in it) is an invalid policy
(InvalidHealthGates naming the gate and the reference); TLS verification is never switched off.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import structlog
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ichord.api import names
from ichord.api.conditions import Condition, bounded_message, now_rfc3339, parse_time
from ichord.api.names import Phase
from ichord.errors import IchordError
from ichord.kube import errors as kube_errors
from ichord.kube.client import KubeClient
from ichord.operations import backbone, gate_cel
from ichord.operations.op_status import Transition
from ichord.operations.outcome import Blocked, Requeue
from ichord.operations.renewal import RenewalPolicyError, parse_duration
from ichord.pki.scrub import SCRUBBER
from ichord.settings import Timing

log = structlog.get_logger(__name__)

Obj = dict[str, Any]

#: The status section the verdicts live in.
SECTION = "healthGates"
GATE_TYPES = ("delay", "cel", "prometheus", "alertmanager")
#: A query or an alert list that takes longer than this counts as a failing gate (it says so).
HTTP_TIMEOUT = 10.0
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Alertmanager's matcher: label, operator, value (quoted or not).
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')
#: A ConfigMap's or Secret's name (a DNS subdomain) and a key of its data.
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
#: caBundle's references: field -> the kind of object it names.
CA_BUNDLE_REFS = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}


class GateSpecError(IchordError):
    """spec.health cannot be followed (a bad duration, an expression that does not compile, a bad URL)."""


@dataclass(frozen=True)
class CABundleRef:
    """An https gate's CA bundle: ``key`` of the ConfigMap or Secret ``name`` in the TalosCluster's namespace."""

    kind: str  # ConfigMap or Secret
    name: str
    key: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name} key {self.key}"


@dataclass(frozen=True)
class Gate:
    """One declared gate: its name, type and the fields of its type."""

    name: str
    type: str
    #: delay: seconds, unscaled (the policy scales them).
    duration: float = 0.0
    #: cel: the expression and its compiled program.
    expression: str = ""
    program: Any = None
    #: prometheus and alertmanager: the base URL.
    url: str = ""
    query: str = ""
    threshold: float | None = None
    matchers: tuple[str, ...] = ()
    #: https: the CA bundle to verify the server against (instead of the system's CAs), and its certificates (PEM)
    #: once read (resolve_trust).
    ca_bundle: CABundleRef | None = None
    trust: str = ""


@dataclass(frozen=True)
class HealthPolicy:
    gates: tuple[Gate, ...] = ()
    #: Seconds between a node's first passing verdict and its start (the delay gates' durations included).
    soak: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.gates and self.soak <= 0


@dataclass(frozen=True)
class Verdict:
    name: str
    type: str
    passing: bool
    message: str


def time_scale(timing: Timing) -> float:
    """ICHORD_TIME_SCALE as Timing applied it (every default duration is scaled by the same factor)."""
    return timing.retry / Timing().retry


# ---- the policy ---------------------------------------------------------------------------------


def policy_of(cluster: Obj, op: Obj, *, scale: float = 1.0) -> HealthPolicy:
    """The cluster's spec.health with the operation's (gates added, soak replaced). Raises GateSpecError."""
    on_cluster = (cluster.get("spec") or {}).get("health") or {}
    # The spec the operation started from (changes after the start are ignored: the acceptedSpec).
    accepted = (op.get("status") or {}).get("acceptedSpec") or op.get("spec") or {}
    on_op = accepted.get("health") or {}
    gates = [*_gates(on_cluster, "TalosCluster spec.health"), *_gates(on_op, "TalosOperation spec.health")]
    seen: set[str] = set()
    for g in gates:
        if g.name in seen:
            raise GateSpecError(f"two health gates are named {g.name!r}; each gate needs its own name")
        seen.add(g.name)
    soak_text = on_op.get("soak") if on_op.get("soak") is not None else on_cluster.get("soak")
    soak = _seconds(soak_text, "spec.health.soak") if soak_text is not None else 0.0
    soak = max([soak, *(g.duration for g in gates if g.type == "delay")])
    return HealthPolicy(tuple(gates), soak * scale)


def declared(cluster: Obj, op: Obj) -> bool:
    """Whether the cluster or the operation declares any gate or soak (workers then start in rounds, each gated)."""
    accepted = (op.get("status") or {}).get("acceptedSpec") or op.get("spec") or {}
    return any(bool(h.get("gates")) or h.get("soak") not in (None, "0", "0s")
               for h in ((cluster.get("spec") or {}).get("health") or {}, accepted.get("health") or {})
               if isinstance(h, dict))


def _seconds(text: Any, where: str) -> float:
    if text in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(str(text)).total_seconds()
    except RenewalPolicyError:
        raise GateSpecError(f"{where} {text!r} is not a duration such as 30s, 10m, 1h or 1h30m") from None


def _gates(health: Any, where: str) -> list[Gate]:
    if not isinstance(health, dict):
        raise GateSpecError(f"{where} must be an object")
    raw = health.get("gates") or []
    if not isinstance(raw, list):
        raise GateSpecError(f"{where}.gates must be a list")
    return [_gate(g, f"{where}.gates[{i}]") for i, g in enumerate(raw)]


def _gate(raw: Any, where: str) -> Gate:
    if not isinstance(raw, dict):
        raise GateSpecError(f"{where} must be an object")
    name = str(raw.get("name") or "")
    if not _NAME.match(name):
        raise GateSpecError(f"{where}.name {name!r} must be a lowercase DNS label (a-z, 0-9, -)")
    kinds = [t for t in GATE_TYPES if raw.get(t) is not None]
    if len(kinds) != 1:
        raise GateSpecError(f"health gate {name!r} must set exactly one of {', '.join(GATE_TYPES)} "
                            f"(it sets {', '.join(kinds) or 'none'})")
    kind = kinds[0]
    body = raw[kind]
    if not isinstance(body, dict):
        raise GateSpecError(f"health gate {name!r}: {kind} must be an object")
    if kind == "delay":
        return Gate(name, kind, duration=_seconds(body.get("duration"), f"health gate {name!r} delay.duration"))
    if kind == "cel":
        expression = str(body.get("expression") or "")
        return Gate(name, kind, expression=expression, program=compile_cel(expression, name))
    url = str(body.get("url") or "")
    if "@" in url.split("?", 1)[0].split("#", 1)[0].partition("://")[2].split("/", 1)[0]:
        # Never echoed: the spec is readable by whoever reads the cluster, and a message goes to status and Events.
        raise GateSpecError(f"health gate {name!r}: {kind}.url carries credentials (user:password@host); ichord "
                            f"repeats a gate's URL in status and Events, so it refuses them: point the gate at an "
                            f"endpoint that needs none (inside the cluster, or through a proxy)")
    if not re.match(r"^https?://[^\s/]+", url):
        raise GateSpecError(f"health gate {name!r}: {kind}.url {url!r} must be an http:// or https:// URL")
    ca_bundle = _ca_bundle(body.get("caBundle"), f"health gate {name!r}: {kind}.caBundle", url)
    if kind == "prometheus":
        query = str(body.get("query") or "")
        if not query.strip():
            raise GateSpecError(f"health gate {name!r}: prometheus.query is empty")
        threshold = body.get("threshold")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)):
            raise GateSpecError(f"health gate {name!r}: prometheus.threshold must be a number")
        return Gate(name, kind, url=url.rstrip("/"), query=query,
                    threshold=None if threshold is None else float(threshold), ca_bundle=ca_bundle)
    matchers = body.get("matchers") or []
    if not isinstance(matchers, list) or not matchers:
        raise GateSpecError(f"health gate {name!r}: alertmanager.matchers must list at least one matcher, "
                            "e.g. severity=\"critical\"")
    parsed = []
    for m in matchers:
        found = _MATCHER.match(str(m))
        if not found:
            raise GateSpecError(f"health gate {name!r}: alertmanager matcher {m!r} is not label=value, label!=value,"
                                " label=~regex or label!~regex")
        label, op, value = found.groups()
        value = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
        parsed.append(f'{label}{op}"{value}"')
    return Gate(name, kind, url=url.rstrip("/"), matchers=tuple(parsed), ca_bundle=ca_bundle)


def _ca_bundle(raw: Any, where: str, url: str) -> CABundleRef | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise GateSpecError(f"{where} must be an object")
    refs = [f for f in CA_BUNDLE_REFS if raw.get(f) is not None]
    if len(refs) != 1:
        raise GateSpecError(f"{where} must set exactly one of {', '.join(CA_BUNDLE_REFS)} "
                            f"(it sets {', '.join(refs) or 'none'})")
    if not url.startswith("https://"):
        raise GateSpecError(f"{where} is set, but the URL is not https://: a CA bundle only verifies https servers")
    ref = raw[refs[0]]
    name = str(ref.get("name") or "") if isinstance(ref, dict) else ""
    key = str(ref.get("key") or "") if isinstance(ref, dict) else ""
    if not _OBJECT_NAME.match(name) or len(name) > 253:
        raise GateSpecError(f"{where}.{refs[0]}.name {name!r} is not a {CA_BUNDLE_REFS[refs[0]]} name")
    if not _DATA_KEY.match(key) or len(key) > 253:
        raise GateSpecError(f"{where}.{refs[0]}.key {key!r} is not a key of a {CA_BUNDLE_REFS[refs[0]]}'s data")
    return CABundleRef(CA_BUNDLE_REFS[refs[0]], name, key)


async def resolve_trust(kube: KubeClient, namespace: str, policy: HealthPolicy) -> HealthPolicy:
    """``policy`` with every CA bundle its gates name read from ``namespace`` (one GET per bundle). GateSpecError
    names the gate and the reference when one cannot be followed; other API errors are raised as they are."""
    gates = [replace(g, trust=await _read_bundle(kube, namespace, g)) if g.ca_bundle is not None else g
             for g in policy.gates]
    return replace(policy, gates=tuple(gates))


async def _read_bundle(kube: KubeClient, namespace: str, gate: Gate) -> str:
    ref = gate.ca_bundle
    assert ref is not None
    where = f"health gate {gate.name!r}: {gate.type}.caBundle names {ref.kind} {namespace}/{ref.name}"
    plural = "configmaps" if ref.kind == "ConfigMap" else "secrets"
    try:
        obj = await kube.raw("GET", f"/api/v1/namespaces/{namespace}/{plural}/{ref.name}")
    except kube_errors.NotFound:
        raise GateSpecError(f"{where}, which does not exist: create it, or point caBundle at one that does") from None
    except kube_errors.Forbidden:
        raise GateSpecError(f"{where}, which ichord may not read (its RBAC grants get on ConfigMaps and Secrets "
                            "of the namespaces it serves)") from None
    data: bytes | None = None
    try:
        if ref.kind == "ConfigMap" and ref.key in (obj.get("data") or {}):
            data = str(obj["data"][ref.key]).encode()
        elif ref.kind == "ConfigMap" and ref.key in (obj.get("binaryData") or {}):
            data = base64.b64decode(obj["binaryData"][ref.key], validate=True)
        elif ref.kind == "Secret" and ref.key in (obj.get("data") or {}):
            data = base64.b64decode(obj["data"][ref.key], validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if data is None:
        raise GateSpecError(f"{where}, which has no key {ref.key!r}")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        # Never echoed: whatever the key holds stays where it is.
        raise GateSpecError(f"{where}, whose key {ref.key!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
                            ) from None
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certificates)


def compile_cel(expression: str, name: str) -> Any:
    """The compiled program of a CEL gate; GateSpecError names the gate and the expression's problem (a parse error,
    a variable that is not declared: gate_cel.py)."""
    if not expression.strip():
        raise GateSpecError(f"health gate {name!r}: cel.expression is empty")
    try:
        return gate_cel.compile_expression(expression)
    except gate_cel.CelSpecError as exc:
        raise GateSpecError(f"health gate {name!r}: cel.expression does not compile: {exc}") from None


# ---- asking the gates ---------------------------------------------------------------------------


class Probe(Protocol):
    """What the gates read: the managed cluster's Nodes, and HTTP JSON from Prometheus or Alertmanager."""

    async def nodes(self) -> list[Obj]: ...

    async def get_json(self, url: str, params: Sequence[tuple[str, str]], *, trust: str = "") -> Any:
        """JSON from ``url``; https verified against ``trust`` (PEM certificates) when given, else the system's
        CAs."""


class LiveProbe:
    """The managed cluster through ichord's client; HTTP with aiohttp (TLS verified against the system's CAs, or a
    gate's CA bundle alone)."""

    def __init__(self, nodes: Callable[[], Awaitable[list[Obj]]]) -> None:
        self._nodes = nodes

    async def nodes(self) -> list[Obj]:
        return await self._nodes()

    async def get_json(self, url: str, params: Sequence[tuple[str, str]], *, trust: str = "") -> Any:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT)
        # The bundle alone (create_default_context loads no system CA when given cadata); the name is checked.
        verify = ssl.create_default_context(cadata=trust) if trust else True
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.get(url, params=list(params), ssl=verify) as resp:
                if resp.status >= 400:
                    body = (await resp.text())[:200]
                    raise GateQueryError(f"{url} answered HTTP {resp.status}: {body}")
                return await resp.json(content_type=None)
        except aiohttp.ClientConnectorCertificateError as exc:
            why = getattr(exc.certificate_error, "verify_message", None) or str(exc.certificate_error)
            trusted = "the gate's caBundle" if trust else "the system's CAs (the gate has no caBundle)"
            raise GateQueryError(f"{url}: its TLS certificate is not trusted by {trusted}: {why}; a server signed "
                                 "by a private CA needs caBundle naming a ConfigMap or Secret key that holds that CA"
                                 ) from None


class GateQueryError(IchordError):
    """A gate's source did not answer as expected (the gate fails, saying so)."""


async def evaluate(gate: Gate, probe: Probe, *, target: str) -> Verdict:
    """One gate's verdict. A source that cannot be asked fails the gate (it never passes by default)."""
    try:
        passing, message = await _ask(gate, probe, target)
    except (IchordError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        passing, message = False, f"cannot be asked: {SCRUBBER.exception(exc) if isinstance(exc, IchordError) else exc}"
    return Verdict(gate.name, gate.type, passing, bounded_message(SCRUBBER.text(message)))


async def _ask(gate: Gate, probe: Probe, target: str) -> tuple[bool, str]:
    if gate.type == "delay":
        return True, "a delay: counted in the soak"
    if gate.type == "cel":
        return await _cel(gate, probe, target)
    if gate.type == "prometheus":
        return await _prometheus(gate, probe)
    return await _alertmanager(gate, probe)


async def _cel(gate: Gate, probe: Probe, target: str) -> tuple[bool, str]:
    nodes = await probe.nodes()
    activation = {"nodes": json_to_cel(nodes), "target": json_to_cel(target)}
    try:
        result = gate.program.evaluate(activation)
    except Exception as exc:  # celpy raises CELEvalError and others for a missing field, a bad index
        return False, f"expression failed: {gate_cel.problem(exc)}"
    if isinstance(result, Exception):
        return False, f"expression failed: {gate_cel.problem(result)}"
    if not isinstance(result, BoolType | bool):
        return False, f"expression gave {type(result).__name__} {result!r}, not a bool"
    return (True, "expression is true") if result else (False, "expression is false")


async def _prometheus(gate: Gate, probe: Probe) -> tuple[bool, str]:
    answer = await probe.get_json(f"{gate.url}/api/v1/query", [("query", gate.query)], trust=gate.trust)
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else answer
        raise GateQueryError(f"the query failed: {error}")
    data = answer.get("data") or {}
    result = data.get("result")
    samples: list[tuple[Mapping[str, Any], Any]]
    if data.get("resultType") == "scalar":
        samples = [({}, result[1])] if result else []
    elif data.get("resultType") == "vector":
        samples = [(r.get("metric") or {}, (r.get("value") or [0, "NaN"])[1]) for r in result or []]
    else:
        raise GateQueryError(f"the query gave a {data.get('resultType')}; a gate needs an instant vector or scalar")
    if not samples:
        return True, "the query returned nothing"
    values = [(labels, float(v)) for labels, v in samples]
    if gate.threshold is None:
        return False, f"the query returned {len(values)} series, e.g. {_series(values[0])}"
    over = [s for s in values if not s[1] < gate.threshold]
    if not over:
        return True, f"{len(values)} series, all below {gate.threshold:g}"
    return False, f"{len(over)} series at or above {gate.threshold:g}, e.g. {_series(over[0])}"


def _series(sample: tuple[Mapping[str, Any], float]) -> str:
    labels, value = sample
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{{{shown}}} = {value:g}"


async def _alertmanager(gate: Gate, probe: Probe) -> tuple[bool, str]:
    params = [("active", "true"), ("silenced", "false"), ("inhibited", "false"),
              *(("filter", m) for m in gate.matchers)]
    alerts = await probe.get_json(f"{gate.url}/api/v2/alerts", params, trust=gate.trust)
    if not isinstance(alerts, list):
        raise GateQueryError("the alert list is not a list")
    firing = [a for a in alerts if ((a.get("status") or {}).get("state") or "active") == "active"]
    if not firing:
        return True, f"no firing alert matches {', '.join(gate.matchers)}"
    shown = sorted({str((a.get("labels") or {}).get("alertname") or "?") for a in firing})
    return False, f"{len(firing)} firing alert(s) match {', '.join(gate.matchers)}: {', '.join(shown[:5])}"


# ---- the record in status and the hold ---------------------------------------------------------


@dataclass
class Record:
    """status.healthGates as read: the node the verdicts are for, when its soak began, the last verdict per gate."""

    target: str = ""
    soak_started_at: str | None = None
    gates: dict[str, Obj] = field(default_factory=dict)
    #: The node the gates last let start.
    passed_for: str = ""

    @classmethod
    def of(cls, status: Obj) -> Record:
        raw = status.get(SECTION) or {}
        gates = {str(g.get("name")): dict(g) for g in raw.get("gates") or [] if isinstance(g, dict)}
        return cls(str(raw.get("target") or ""), raw.get("soakStartedAt") or None, gates,
                   str(raw.get("passedFor") or ""))


def _recorded(record: Record, verdicts: list[Verdict], target: str, soak_started_at: str | None,
              now: dt.datetime) -> tuple[Obj, list[tuple[Verdict, bool]]]:
    """The new status section, and the gates whose verdict changed (verdict, was it failing before)."""
    stamp = now_rfc3339(now)
    changed: list[tuple[Verdict, bool]] = []
    rows = []
    for v in verdicts:
        before = record.gates.get(v.name)
        moved = before is None or bool(before.get("passing")) != v.passing
        if moved and (before is not None or not v.passing):
            changed.append((v, before is not None and not before.get("passing")))
        rows.append({"name": v.name, "type": v.type, "passing": v.passing, "message": v.message,
                     "lastEvaluated": stamp,
                     "lastTransitionTime": stamp if moved else str(before.get("lastTransitionTime") or stamp)
                     if before else stamp})
    section: Obj = {"target": target, "gates": rows}
    if soak_started_at:
        section["soakStartedAt"] = soak_started_at
    return section, changed


async def hold(ctx: backbone.Context, kind: backbone.OperationKind, subject: backbone.Subject, cluster: Obj,
               probe: Probe, *, target: str, first: bool) -> Blocked | Requeue | None:
    """Before ``target`` (a node about to start): None when it may start, else what the step returns (module
    docstring's table). ``first``: the plan's first node (no soak before it). Once ``target`` was let through
    (status.healthGates.passedFor), later steps of the same node (its cordon, its drain) return None at once:
    the gates are asked before a node starts, never in the middle of it."""
    record = Record.of(subject.status)
    if record.passed_for == target:
        return None
    try:
        policy = policy_of(cluster, subject.op, scale=time_scale(ctx.timing))
        policy = await resolve_trust(ctx.kube, str((cluster.get("metadata") or {}).get("namespace") or ""), policy)
    except GateSpecError as exc:
        message = f"{exc}; nothing runs until spec.health is fixed"
        change = Transition(Condition(kind.condition_type, "False", names.HealthGateReason.INVALID,
                                      SCRUBBER.text(message)), phase=Phase.PAUSED,
                            event=("Warning", names.HealthGateReason.INVALID), per_message=True, said=None)
        await backbone.transition(ctx, subject, change)
        return Blocked(names.HealthGateReason.INVALID, message, ctx.timing.retry)
    if policy.empty:
        return None
    now = ctx.now()
    verdicts = [await evaluate(g, probe, target=target) for g in policy.gates]
    failing = [v for v in verdicts if not v.passing]
    soak_started = record.soak_started_at if record.target == target else None
    soak_left = 0.0
    if not failing and policy.soak > 0 and not first:
        if soak_started is None:
            # Stamped in whole seconds, rounded up: a soak measured from the record is never shorter than declared.
            up = now + dt.timedelta(microseconds=(1_000_000 - now.microsecond) % 1_000_000)
            soak_started = now_rfc3339(up)
            soak_left = policy.soak + (up - now).total_seconds()
        else:
            soak_left = policy.soak - (now - parse_time(soak_started)).total_seconds()
    if failing:
        soak_started = None  # a failing gate starts the soak again once it passes
    section, changed = _recorded(record, verdicts, target, soak_started, now)
    _announce(ctx, subject, target, changed)

    def keep(status: Obj) -> None:
        status[SECTION] = section

    if failing:
        shown = "; ".join(f"gate {v.name} ({v.type}) failing: {v.message}" for v in failing)
        message = (f"{target} waits for its health gates: {shown}; asked again every {ctx.timing.retry:g} s, "
                   "never skipped")
        change = Transition(Condition(kind.condition_type, "False", names.HealthGateReason.FAILING,
                                      SCRUBBER.text(message)), phase=Phase.PAUSED, event=None, said=None)
        await backbone.transition(ctx, subject, change, keep)
        log.info("health gates failing", operation=subject.name, target=target, gates=[v.name for v in failing])
        return Blocked(names.HealthGateReason.FAILING, message, ctx.timing.retry)
    if soak_left > 0:
        message = (f"{target} waits for the soak: the health gates passed; asked again in {soak_left:.0f} s, "
                   f"then {target} starts")
        await backbone.write(ctx, subject, keep, *backbone.in_progress(ctx, kind, names.HealthGateReason.SOAKING,
                                                                        message))
        return Requeue(soak_left, names.HealthGateReason.SOAKING)
    section["passedFor"] = target
    await backbone.write(ctx, subject, keep)
    log.info("health gates passed", operation=subject.name, target=target, gates=len(verdicts))
    return None


def _announce(ctx: backbone.Context, subject: backbone.Subject, target: str,
              changed: list[tuple[Verdict, bool]]) -> None:
    """A Warning when a gate starts failing (a person may need to look), a Normal when it passes again."""
    for v, was_failing in changed:
        if not v.passing:
            backbone.event(ctx, subject, "Warning", names.HealthGateReason.FAILING,
                           f"health gate {v.name} ({v.type}) failing before {target}: {v.message}; "
                           "the operation waits for it")
        elif was_failing:
            backbone.event(ctx, subject, "Normal", names.EventReason.GATE_PASSED,
                           f"health gate {v.name} ({v.type}) passes again before {target}: {v.message}")


def kube_probe(managed: KubeClient) -> LiveProbe:
    """The gates' probe over a client of the managed cluster (its Nodes read once per evaluation, when a CEL gate
    asks)."""

    async def opened() -> KubeClient:
        return managed

    return opening_probe(opened)


def opening_probe(client: Callable[[], Awaitable[KubeClient]]) -> LiveProbe:
    """The probe over a managed-cluster client opened only when a CEL gate asks for Nodes (a CA rotation's pass
    start opens none when no CEL gate is declared)."""

    async def nodes() -> list[Obj]:
        listed = await (await client()).raw("GET", "/api/v1/nodes")
        return list(listed.get("items") or [])

    return LiveProbe(nodes)
