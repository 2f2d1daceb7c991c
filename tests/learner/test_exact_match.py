"""``exact_matches``: the sft evaluation's greedy exact match, against greedy decoding itself."""

from __future__ import annotations

import torch

from learner.offline import exact_matches


def test_exact_match_is_every_unmasked_token_the_argmax() -> None:
    vocab = 5
    ids = torch.tensor([[1, 2, 0], [3, 4, 4], [2, 2, 0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logits = torch.full((3, 3, vocab), -1.0)
    for b in range(3):
        for t in range(3):
            logits[b, t, ids[b, t]] = 1.0
    logits[0, 2, 3] = 9.0  # a padding position: its argmax does not count
    logits[1, 2, 0] = 9.0  # the last token (EOS) of row 1 is not the argmax
    assert exact_matches(logits, ids, mask).tolist() == [True, False, True]


def test_exact_match_agrees_with_greedy_decoding_of_a_real_model() -> None:
    # A reference made of the model's own greedy continuation matches; one token off does not.
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        seq = prompt
        for _ in range(5):  # greedy decoding, one token at a time
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
        greedy = seq[:, 4:]
        other = greedy.clone()
        other[0, 2] = (other[0, 2] + 1) % config.vocab_size
        for ref, want in ((greedy, True), (other, False)):
            logits = model(torch.cat([prompt, ref], dim=1)).logits[:, 3:-1]
            assert exact_matches(logits, ref, torch.ones_like(ref)).item() is want
