"""The machine reconciler: every approved machine runs exactly what ichord renders for it."""
