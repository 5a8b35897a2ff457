"""Operations run by a cluster actor: the backbone, ca-rotation, config rollout and the CA expiry pass."""
