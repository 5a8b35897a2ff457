"""Mailbox actors: one per TalosCluster, serialising everything done to that cluster."""
