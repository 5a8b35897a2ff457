"""The ``config`` operation (docs/decisions.md#config-rollout): roll reboot-requiring and API-server-restart changes out
one node at a time."""
