"""The embedded inference engine: a Hugging Face causal LM served over HTTP on CPU (or one GPU).

It speaks the protocols of the GPU engines so the rest of the system cannot tell them apart:
OpenAI-compatible ``/v1/completions``, SGLang's native ``/generate``, and SGLang-shaped weight
updates (a torch.distributed broadcast from the learner, or a reload from disk).

- :mod:`.protocol` — request schemas (pydantic, no torch), shared by both HTTP shapes.
- :mod:`.generation` — :class:`~.generation.BatchGenerator`: one thread owns the model; requests
  that arrive together are decoded together with a KV cache; weight updates run between batches.
- :mod:`.weights` — the weight-update process group and loading a checkpoint from disk.
- :mod:`.server` — the FastAPI app.
"""
