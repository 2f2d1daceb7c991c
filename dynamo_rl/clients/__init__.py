"""The project's network clients of other services, and the one base they are built on.

- :mod:`dynamo_rl.clients.base`: :class:`~dynamo_rl.clients.base.Client` (an address, a deadline
  per call and the retry policy of :mod:`dynamo_rl.retry`, built one way from one set of keywords)
  and :class:`~dynamo_rl.clients.base.HttpClient` (the same with a pooled ``httpx`` client);
- :mod:`dynamo_rl.clients.allocator`: the allocator's gRPC client, beside its contract
  (:mod:`dynamo_rl.contracts.allocator`), so a rollout worker (or any framework) reaches the
  allocator without importing the allocator's package.

The sandbox client (:mod:`dynamo_rl.envs.sandbox`) and the reward service's client
(``services/rollout/reward_client.py``) are HTTP clients on the same base. Nothing here imports
torch or another service's folder.
"""
