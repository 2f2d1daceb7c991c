"""The network services: reward (verification) and rollout (engines and workers)."""
