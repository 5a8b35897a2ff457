"""The ``config`` operation (ADR 0080): roll reboot-requiring and API-server-restart changes out one node at a time."""
