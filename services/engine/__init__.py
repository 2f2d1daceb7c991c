"""The embedded inference engine: a Hugging Face causal LM served over HTTP on CPU (or one GPU).

It speaks the protocols of the GPU engines so the rest of the system cannot tell them apart:
OpenAI-compatible ``/v1/completions``, SGLang's native ``/generate``, and both weight-control
protocols of :mod:`dynamo_rl.contracts.engine` — SGLang-shaped (a torch.distributed broadcast
from the learner, or a reload from disk) and vLLM's weight-transfer routes (pause, start, update,
finish, resume). It runs as its own process (``dynamo-rl engine``) and imports nothing of the
rollout worker, the learner, the allocator or the reward service.

- :mod:`.protocol` — request schemas (pydantic, no torch), shared by both HTTP shapes.
- :mod:`.generation` — :class:`~.generation.BatchGenerator`: one thread owns the model; requests
  that arrive together are decoded together with a KV cache; weight updates run between batches.
- :mod:`.weights` — the weight-update process group and loading a checkpoint from disk.
- :mod:`.server` — the FastAPI app.
- :mod:`.metrics` — its Prometheus metrics; :mod:`.cli` — the ``dynamo-rl engine`` command line.
"""
