"""``LeaderElected`` on every TalosCluster: a condition that says when no replica has led for longer than the Lease.

Without a leader nothing is reconciled and no operation advances, and nothing in the clusters' status said so. Every
replica runs this watch beside its elector:

    this replica has seen no replica lead for longer than the Lease (LeaderElector.no_leader)
        -> LeaderElected=False/NoLeader on each TalosCluster it knows (written once, on the transition)
    this replica leads, and a cluster says NoLeader
        -> LeaderElected=True/Leading (written once, on the recovery)

A cluster that never lost its leader never carries the condition: nothing is written on a healthy install. The
writes are best effort (the usual cause of no leader, the API failing, fails them too: they are tried again on
the next tick) and start from the informer's copy (one PATCH, no GET). ``ichord_no_leader`` says the same.
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound
from ichord.kube.status import update_status
from ichord.leader import LeaderElector
from ichord.watchers.informer import Informer

log = structlog.get_logger("ichord.watchers.leader_status")
Obj = dict[str, Any]


def _wanted(elector: LeaderElector, current: Obj | None, lease: str) -> Condition | None:
    """The LeaderElected condition to write on a cluster whose current one is ``current``; None: leave it."""
    if elector.no_leader():
        if current is not None and (current.get("status"), current.get("reason")) == (
                "False", names.LeaderElectedReason.NO_LEADER):
            return None
        return Condition(names.LEADER_ELECTED, "False", names.LeaderElectedReason.NO_LEADER,
                         f"no ichord replica has held the Lease {lease} for longer than its "
                         f"{elector.timing.lease_duration:g} s: nothing is reconciled and no operation advances; "
                         "check the ichord pods and their logs (ichord_leaderless_seconds says for how long)")
    if elector.is_leader and current is not None and current.get("status") != "True":
        return Condition(names.LEADER_ELECTED, "True", names.LeaderElectedReason.LEADING,
                         f"a replica holds the Lease {lease} again and reconciles this cluster")
    return None


async def report(kube: KubeClient, clusters: Informer, elector: LeaderElector, lease: str) -> int:
    """One pass over the clusters this replica knows; how many it wrote."""
    written = 0
    for (namespace, name), obj in sorted(clusters.cache.items()):
        current = find((obj.get("status") or {}).get("conditions"), names.LEADER_ELECTED)
        cond = _wanted(elector, current, lease)
        if cond is None:
            continue

        def mutate(status: Obj, _obj: Obj, cond: Condition = cond) -> Obj:
            status["conditions"] = set_condition(status.get("conditions"), cond)
            return status

        try:
            await update_status(crds.clusters(kube), namespace, name, mutate, current=obj)
        except NotFound:
            continue
        except IchordError as exc:
            log.debug("LeaderElected not written; tried again on the next tick", cluster=f"{namespace}/{name}",
                      error=str(exc))
            continue
        written += 1
        log.info("LeaderElected", cluster=f"{namespace}/{name}", status=cond.status, reason=cond.reason)
    return written


async def watch(kube: KubeClient, clusters: Informer, elector: LeaderElector, lease: str, interval: float) -> None:
    """``report`` every ``interval`` (the election's retry period), for as long as the process runs."""
    await clusters.wait_synced()
    while True:
        await report(kube, clusters, elector, lease)
        await anyio.sleep(interval)
