"""The ConfigRollout condition on a TalosMachine (docs/decisions.md#config-rollout and its addendum): what the rollout
does to it.

Written on a fresh copy with conflict retry (the machine reconciler writes the same status), and only
when the reason or message changes; a reboot's polls (``keep``) do not rewrite the Rebooting the reboot request
wrote, so a reboot costs one write however many steps it lasts. True while the rollout works on the machine
(Draining, Rebooting, APIServerRestarting, APIServerNotReady); False/RolledOut once it is done.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.status import update_status
from ichord.pki.scrub import SCRUBBER

Obj = dict[str, Any]


class RolloutReason:
    DRAINING = "Draining"
    REBOOTING = "Rebooting"
    API_SERVER_RESTARTING = "APIServerRestarting"
    ROLLED_OUT = "RolledOut"
    FAILED = "Failed"


async def set_rollout_condition(kube: KubeClient, namespace: str, machine: str, status: str, reason: str,
                                message: str, *, now: dt.datetime, current: Obj | None = None,
                                keep: bool = False) -> None:
    """Set ConfigRollout on ``machine``; ``current`` (the object as last read) saves a write when nothing changes,
    and the write's read (update_status: a stale copy costs a 409 and a fresh read). ``keep``: a condition of this
    status and reason already says it; only its message would change (a reboot's poll), so nothing is written."""
    message = SCRUBBER.text(message)

    def said(old: Obj | None) -> bool:
        if old is None or (old.get("status"), old.get("reason")) != (status, reason):
            return False
        return keep or old.get("message") == message

    if said(find(((current or {}).get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT)):
        return

    def mutate(st: Obj, _obj: Obj) -> Obj | None:
        if said(find(st.get("conditions"), names.CONFIG_ROLLOUT)):
            return None
        st["conditions"] = set_condition(st.get("conditions"), Condition(names.CONFIG_ROLLOUT, status, reason,
                                                                         message), now=now)
        return st

    await update_status(crds.machines(kube), namespace, machine, mutate, current=current)
