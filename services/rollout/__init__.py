"""Rollout: engine clients and rollout workers (the embedded engine is ``services.engine``)."""
