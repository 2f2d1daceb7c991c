"""Rollout: the embedded inference engine, engine clients and rollout workers."""
