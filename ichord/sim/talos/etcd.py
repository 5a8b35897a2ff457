"""Per-cluster etcd simulation: members, leader, alarms, health and quorum.

A member loads its CA bundle when etcd starts (boot), never on a configuration change: it presents
a peer certificate signed by the bundle's first certificate and trusts every certificate in the
bundle (docs/decisions.md#etcd-reboot-roll). Two members talk only if each trusts the other's signer. A member is
healthy when it runs and reaches a majority of the cluster (itself included); the cluster has quorum when
some member is healthy. Every change of health, leader or quorum goes to the history.

Faults: ``trust_first_only`` makes a member that starts trust only its bundle's first certificate (the
open question of docs/decisions.md#ca-rotation-passes: is the second certificate of ``cluster.etcd.ca.crt`` trusted?);
alarms (NOSPACE, CORRUPT) are raised per member and listed by EtcdAlarmList.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.serialization import Encoding

from ichord.pki import pem as _pem
from ichord.sim.talos.history import History


@dataclass
class EtcdMember:
    name: str
    member_id: int
    ip: str
    signer: str = ""  # fingerprint of the CA that signed its peer certificate
    trusted: frozenset[str] = frozenset()
    running: bool = False
    forced_unhealthy: bool = False
    alarms: list[int] = field(default_factory=list)  # EtcdMemberAlarm.AlarmType values

    @property
    def peer_url(self) -> str:
        return f"https://{self.ip}:2380"

    @property
    def client_url(self) -> str:
        return f"https://{self.ip}:2379"


def fingerprint(pem: bytes) -> str:
    """The short fingerprint a member's signer and trust set are recorded with (history, state)."""
    return hashlib.sha256(_pem.load_certificate(pem).public_bytes(Encoding.DER)).hexdigest()[:16]


class EtcdCluster:
    def __init__(self, history: History) -> None:
        self.history = history
        self.members: dict[str, EtcdMember] = {}
        self.leader: str | None = None
        self.raft_term = 1
        self.raft_index = 1
        self._healthy: dict[str, bool] = {}
        self._quorum = False
        #: Fault: a starting member trusts only the first certificate of its CA bundle.
        self.trust_first_only = False

    # ---- membership and lifecycle -----------------------------------------------------------

    def start_member(self, name: str, ip: str, ca_bundle: bytes, *, forced_unhealthy: bool = False) -> EtcdMember:
        """etcd starts on a node (boot): loads the CA bundle of the running configuration."""
        certs = [b for b in _pem.pem_blocks(ca_bundle) if _pem.pem_label(b) == "CERTIFICATE"]
        member = self.members.get(name)
        if member is None:
            member_id = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
            member = self.members[name] = EtcdMember(name, member_id, ip)
            self.history.record("etcd_member_added", name, member_id=member_id)
        member.signer = fingerprint(certs[0])
        member.trusted = frozenset(fingerprint(c) for c in (certs[:1] if self.trust_first_only else certs))
        member.running = True
        member.forced_unhealthy = forced_unhealthy
        self.history.record("etcd_member_started", name, signer=member.signer, trusted=sorted(member.trusted))
        self.evaluate()
        return member

    def stop_member(self, name: str) -> None:
        member = self.members.get(name)
        if member is not None and member.running:
            member.running = False
            self.history.record("etcd_member_stopped", name)
            self.evaluate()

    def remove_member(self, name: str) -> None:
        """EtcdRemoveMemberByID: the member leaves the cluster (stopped first if it runs)."""
        self.stop_member(name)
        if self.members.pop(name, None) is not None:
            self.history.record("etcd_member_removed", name)
            self.evaluate()

    def set_forced_unhealthy(self, name: str, value: bool) -> None:
        if name in self.members:
            self.members[name].forced_unhealthy = value
            self.evaluate()

    def raise_alarm(self, name: str, alarm: int) -> None:
        """Raise an alarm (1 NOSPACE, 2 CORRUPT) on member ``name``."""
        member = self.members[name]
        if alarm not in member.alarms:
            member.alarms.append(alarm)
            self.history.record("etcd_alarm", name, alarm=alarm)

    def disarm(self, name: str) -> None:
        member = self.members[name]
        if member.alarms:
            member.alarms.clear()
            self.history.record("etcd_alarm_disarmed", name)

    # ---- connectivity -----------------------------------------------------------------------

    def talks(self, a: EtcdMember, b: EtcdMember) -> bool:
        return a.signer in b.trusted and b.signer in a.trusted

    def _reachable(self, member: EtcdMember) -> int:
        if not member.running or member.forced_unhealthy:
            return 0
        return sum(1 for other in self.members.values()
                   if other.running and not other.forced_unhealthy and (other is member or self.talks(member, other)))

    def healthy(self, name: str) -> bool:
        return self._healthy.get(name, False)

    @property
    def has_quorum(self) -> bool:
        return self._quorum

    def serves_apiserver(self, name: str, trusted: frozenset[str], client_signer: str) -> bool:
        """Talos points kube-apiserver at its node's own member (https://localhost:2379): it reaches etcd when
        that member is healthy, presents a certificate the API server trusts (``trusted``, its etcd CA bundle)
        and trusts the API server's client certificate (signed by ``client_signer``)."""
        member = self.members.get(name)
        return (member is not None and self._healthy.get(name, False) and member.signer in trusted
                and client_signer in member.trusted)

    def peer_errors(self, name: str) -> list[str]:
        member = self.members[name]
        out = []
        for other in self.members.values():
            if other is member or not other.running:
                continue
            if not self.talks(member, other):
                out.append(f"rejected connection with {other.name} ({other.peer_url}): "
                           "tls: failed to verify certificate: x509: certificate signed by unknown authority")
        return out

    def evaluate(self) -> None:
        n = len(self.members)
        healthy = {name: n > 0 and self._reachable(m) * 2 > n for name, m in self.members.items()}
        for name, ok in healthy.items():
            if self._healthy.get(name) != ok:
                self.history.record("etcd_member_health", name, healthy=ok,
                                    errors=self.peer_errors(name) if not ok and self.members[name].running else [])
        self._healthy = healthy
        quorum = any(healthy.values())
        if quorum != self._quorum:
            self.history.record("etcd_quorum_lost" if not quorum else "etcd_quorum_regained", None,
                                healthy=sorted(k for k, v in healthy.items() if v), members=n)
        self._quorum = quorum
        if self.leader is not None and not healthy.get(self.leader, False):
            self._set_leader(None)
        if self.leader is None and quorum:
            self._set_leader(next(k for k, v in sorted(healthy.items()) if v))

    def _set_leader(self, name: str | None) -> None:
        if name != self.leader:
            self.leader = name
            self.raft_term += 1
            self.history.record("etcd_leader", name, term=self.raft_term)

    def forfeit(self, name: str) -> str:
        """Leadership moves from ``name`` to another healthy member; "" if ``name`` did not lead."""
        if self.leader != name:
            return ""
        for other in sorted(self.members):
            if other != name and self._healthy.get(other):
                self._set_leader(other)
                return other
        return ""

    def state(self) -> dict[str, object]:
        return {
            "leader": self.leader, "quorum": self._quorum, "term": self.raft_term,
            "members": {k: {"id": m.member_id, "running": m.running, "healthy": self._healthy.get(k, False),
                            "signer": m.signer, "trusted": sorted(m.trusted), "alarms": m.alarms}
                        for k, m in sorted(self.members.items())},
        }
