from __future__ import annotations

from pathlib import Path


def test_tiny_model_roundtrips_through_auto_classes(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner.tiny_model import build_tiny_model

    out = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    text = "What is 12+7?\nAnswer: \\boxed{19}  ünïcode"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) == len(text.encode())  # one token per byte
    assert tok.eos_token_id == 1 and tok.pad_token_id == 0
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))
    assert (out / "model.safetensors").exists()
