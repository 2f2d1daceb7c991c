"""Wire contracts between the processes: one module per contract, imported by both ends, so
neither end can drift from the other.

- ``stream``: rollout workers → Redis stream → learner (writer, leases, reader, lag, decoding);
- ``generation``: which groups carry no signal (``uniform_group``, the rule the worker drops by
  and the learner skips by) and what generating them cost, as carried on the stream and summed
  per learner step;
- ``step_allocation``: how a learner step's prompts were allocated against uniform n (above, at,
  below) and how many the allocator skipped, as carried on the stream;
- ``sampling``: the sampling settings (``SamplingParams``), one declaration for the config, the
  rollout clients, the engine and the learner, converted at the HTTP and protobuf edges only;
- ``engine``: the engines' generation API (``/v1/completions``, ``/generate``) and their registry;
- ``weight_control``: the weight-update protocols (SGLang- and vLLM-shaped) and their bodies;
- ``reward``: the reward service's HTTP API (``/v1/verify``, ``/run_code``, ``/healthz``).
- ``allocator``: the allocation parameters, one model for the config, the allocator's client,
  server and algorithm (the proto ``dynamo.v1.AllocateRequest`` is their wire format).
"""
