"""What a contract mismatch says (docs/decisions.md#contract-match): one wording for the machine's Ready and for an
operation Blocked on the node, so both name the two versions and the same way out.

A TalosCluster's ``spec.talosVersion`` is the contract every machine's configuration is rendered for; a node whose
running Talos (its Version API's tag, ``v1.14.5``) is of another major.minor is given nothing.
"""

from __future__ import annotations

from ichord.contract import SUPPORTED_CONTRACTS, VersionContract, running_contract


def remedy(running: str, contract: VersionContract, *, cluster: str, namespace: str) -> str:
    """The way out, with the command that works pasted: bring the node to the contract, or (when every node runs
    one ichord renders) the contract to the nodes."""
    ran = running_contract(running)
    node_side = f"Upgrade Talos on the node to a {contract} release first"
    if ran is None or ran not in SUPPORTED_CONTRACTS:
        supported = ", ".join(str(c) for c in SUPPORTED_CONTRACTS)
        return (f"{node_side} (ichord renders {supported}: a node running {running or 'no known version'} cannot "
                "be given a configuration)")
    patch = '{"spec":{"talosVersion":"' + str(ran) + '"}}'
    return (f"{node_side}, or, if every node of the cluster runs {ran}, set the contract to it: "
            f"`kubectl -n {namespace} patch taloscluster {cluster} --type merge -p '{patch}'`")


def machine_message(running: str, contract: VersionContract, *, cluster: str, namespace: str) -> str:
    """Ready=False/ContractMismatch's message on a TalosMachine."""
    return (f"the node runs Talos {running or '(no version reported)'} but TalosCluster {namespace}/{cluster} "
            f"renders its configuration for the {contract} contract (spec.talosVersion); nothing was applied. "
            + remedy(running, contract, cluster=cluster, namespace=namespace))


def operation_message(machine: str, endpoint: str, running: str, contract: VersionContract, *, cluster: str,
                      namespace: str) -> str:
    """An operation's Blocked message when it would apply to a node of another contract."""
    return (f"TalosMachine {machine} ({endpoint}) runs Talos {running or '(no version reported)'} but TalosCluster "
            f"{namespace}/{cluster} renders for the {contract} contract (spec.talosVersion); nothing was applied to "
            "it and the operation waits here. "
            + remedy(running, contract, cluster=cluster, namespace=namespace)
            + "; the operation goes on by itself once the node matches")
