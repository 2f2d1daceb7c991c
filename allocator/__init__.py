"""Dynamic Rollout Allocation: the allocation algorithm, its Redis statistics and its gRPC service."""
