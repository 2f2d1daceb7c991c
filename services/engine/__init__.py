"""The embedded inference engine: a Hugging Face causal LM served over HTTP on CPU (or one GPU).

It speaks the protocols of the GPU engines so the rest of the system cannot tell them apart:
OpenAI-compatible ``/v1/completions``, SGLang's native ``/generate``, and both weight-control
protocols of :mod:`dynamo_rl.contracts.weight_control` — SGLang-shaped (a torch.distributed
broadcast from the learner, or a reload from disk) and vLLM's weight-transfer routes (pause, start, update,
finish, resume). It runs as its own process (``dynamo-rl engine``) and imports nothing of the
rollout worker, the learner, the allocator or the reward service.

Its request and answer bodies are the models of :mod:`dynamo_rl.contracts.engine` and
:mod:`dynamo_rl.contracts.weight_control`, the ones its clients build and parse with.

- :mod:`.engine` — :class:`~.engine.Engine`: the loaded model and its batch loop, requests turned
  into sequences (checks that need the model).
- :mod:`.batch_loop` — :class:`~.batch_loop.BatchGenerator`: one scheduler thread owns the model
  and decodes queued sequences together in one loop, with one join rule
  (:class:`~.batch_loop.JoinRule`; ``static`` batching is the rule that takes nothing in
  mid-batch); weight updates run between batches or between tokens.
- :mod:`.sampler` — the next token of each row (temperature, top-k, top-p, per-row generators)
  and the log-probs reported; :mod:`.kv_cache` — a batch's KV cache: prefill layout, merge, trim.
- :mod:`.weight_updates` — both weight-update protocols (SGLang- and vLLM-shaped, pause/resume)
  and the LoRA adapter loads (:mod:`.adapters`); :mod:`.weights` — the weight-update process
  group and loading a checkpoint from disk.
- :mod:`.routes` — the HTTP routes (generation, weight control); :mod:`.app` — the FastAPI app
  around them (errors, registration, informational routes).
- :mod:`.metrics` — its Prometheus metrics; :mod:`.cli` — the ``dynamo-rl engine`` command line.
"""
