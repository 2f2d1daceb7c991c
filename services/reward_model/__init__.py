"""The reward-model worker process (torch + transformers), started by the reward service."""
