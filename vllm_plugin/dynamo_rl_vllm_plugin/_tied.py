"""Re-run the CPU post-processing of embedding layers after their weights changed."""

from __future__ import annotations

import torch


def refresh_embedding_kernels(model: torch.nn.Module) -> int:
    """Re-run ``process_weights_after_loading`` of every unquantized (vocab-parallel) embedding.

    On CPU vLLM pre-packs the output layer's weight for its GEMM kernel once, after loading. With
    tied embeddings the output layer *is* ``embed_tokens``; an in-place reload (from disk or a
    weight transfer) writes the new weight but the output layer keeps computing with the old
    pre-packed copy, so logits come from the old model. Re-packing from the current weight is
    idempotent, hence safe to run on every embedding. Returns how many layers were refreshed.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    refreshed = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, VocabParallelEmbedding) and isinstance(
            method, UnquantizedEmbeddingMethod
        ):
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed
