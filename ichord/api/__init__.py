"""CRD models, condition helpers, and the names (reasons, annotations, finalizers) of ichord's API."""
