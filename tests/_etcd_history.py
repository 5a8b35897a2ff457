"""The etcd invariants of docs/decisions.md#invariants (3) read back from the Talos simulator's history, for every tier.

Replays the history in order, keeping which members run, which are healthy and what CA each loaded
(``etcd_member_started`` records its signer and trust set), and reports every broken rule:

- quorum never lost, and at every instant a majority of the members healthy (once all first were);
- every two running members trust each other at every reboot request and every member start;
- no reboot requested while any member is unhealthy;
- the reboots come in whole rounds over the control planes, in order, ``rounds`` of them (one per pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ichord.sim.talos.etcd import fingerprint


def etcd_violations(events: Sequence[dict[str, Any]], control_planes: Sequence[str], *,
                    rounds: int | None = None) -> list[str]:
    """Every broken rule (empty: none). A single member cannot keep quorum through its own reboot
    (docs/decisions.md#etcd-reboot-roll: its API is merely away), so with one control plane only the rounds are
    checked."""
    out: list[str] = []
    keep_quorum = len(control_planes) > 1
    members: dict[str, tuple[str, frozenset[str]]] = {}
    running: set[str] = set()
    healthy: set[str] = set()
    whole = False
    for e in events:
        kind, node = e["kind"], e.get("node")
        if kind == "etcd_member_started":
            members[node] = (e["signer"], frozenset(e["trusted"]))
            running.add(node)
            out += _talk_problems(e, members, running)
        elif kind == "etcd_member_stopped":
            running.discard(node)
        elif kind == "etcd_member_removed":
            members.pop(node, None)
            healthy.discard(node)
        elif kind == "etcd_member_health":
            (healthy.add if e["healthy"] else healthy.discard)(node)
        elif kind == "etcd_quorum_lost" and keep_quorum:
            out.append(f"#{e['seq']}: etcd quorum lost")
        elif kind == "reboot_requested" and node in control_planes:
            if whole and healthy != set(members):
                out.append(f"#{e['seq']}: reboot of {node} requested while {sorted(set(members) - healthy)} "
                           "unhealthy")
            out += _talk_problems(e, members, running)
        if not whole and members and len(members) == len(control_planes) and healthy == set(members):
            whole = True
        if keep_quorum and whole and len(healthy) * 2 <= len(members):
            out.append(f"#{e['seq']} ({kind}): only {sorted(healthy)} of {len(members)} members healthy")
    reboots = [e["node"] for e in events if e["kind"] == "reboot" and e["node"] in control_planes]
    if rounds is not None and reboots != list(control_planes) * rounds:
        out.append(f"control plane reboots {reboots}, expected {rounds} round(s) of {list(control_planes)}")
    return out


def _talk_problems(e: dict[str, Any], members: dict[str, tuple[str, frozenset[str]]], running: set[str]) -> list[str]:
    out = []
    for a in sorted(running):
        for b in sorted(running):
            if a < b and not (members[a][0] in members[b][1] and members[b][0] in members[a][1]):
                out.append(f"#{e['seq']} ({e['kind']}): running members {a} and {b} do not trust each other")
    return out


def final_trust(state: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Each member's (signer, trusted) from ``EtcdCluster.state()``."""
    return {name: (str(m["signer"]), list(m["trusted"])) for name, m in state["members"].items()}


def ca_fp(cert_pem: bytes) -> str:
    return fingerprint(cert_pem)
