"""Wire contracts between the processes: one module per contract, imported by both ends, so
neither end can drift from the other.

- ``stream``: rollout workers → Redis stream → learner (writer, leases, reader, lag, decoding);
- ``engine``: the engine registry and the weight-update protocols (SGLang- and vLLM-shaped);
- ``reward``: the reward service's HTTP API (``/v1/verify``, ``/run_code``, ``/healthz``).
- ``allocator``: the allocation parameters, one model for the config, the allocator's client,
  server and algorithm (the proto ``dynamo.v1.AllocateRequest`` is their wire format).
"""
