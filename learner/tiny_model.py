"""Tiny models for laptops, CI and tests: a Qwen2-architecture causal LM built from a config and a
character-level (byte-level, no merges) tokenizer, saved in the ordinary Hugging Face format.

Nothing is downloaded: the same loading code (``AutoModelForCausalLM.from_pretrained``,
``AutoTokenizer.from_pretrained``) then reads a real checkpoint on a GPU box. The tokenizer has one
token per byte plus ``<pad>``, ``<eos>`` and ``<unk>`` (259 tokens), so every ASCII character is
one token and ``decode(encode(text)) == text`` for any text.
"""

from __future__ import annotations

from pathlib import Path

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_char_tokenizer():
    """A byte-level BPE tokenizer with no merges: one token per byte (per character for ASCII).

    It is the same kind of tokenizer as Qwen2's (``transformers`` loads Qwen2 checkpoints with
    its Qwen2 tokenizer class, which is byte-level BPE), so the tiny model round-trips through the
    ordinary ``AutoTokenizer`` path exactly like a real checkpoint.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *_byte_symbols()])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""``init-model --chat-template``'s chat template (roles as ``<|role|>`` markers): what an engine's
``/v1/chat/completions`` renders with, as the verifiers environments need."""


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
    chat_template: str | None = None,
) -> Path:
    """Build a randomly initialised Qwen2 model with the character tokenizer into ``out_dir``
    (``chat_template``: a Jinja chat template saved with the tokenizer; none by default)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = Path(out_dir)
    tokenizer = build_char_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``dynamo-rl init-model``: build a tiny model into a folder."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="dynamo-rl init-model",
        description="Build a randomly initialised tiny Qwen2 model with a byte-level tokenizer "
        "(Hugging Face format, nothing downloaded).",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--hidden-size", type=int, default=128, help="width (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    parser.add_argument("--chat-template", action="store_true",
                        help="save a chat template with the tokenizer (CHAT_TEMPLATE; none "
                        "otherwise), for chat requests to the engine")  # fmt: skip
    args = parser.parse_args(argv)
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error("--heads must divide --hidden-size and --kv-heads must divide --heads")
    out = build_tiny_model(
        args.out,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        seed=args.seed,
        chat_template=CHAT_TEMPLATE if args.chat_template else None,
    )
    print(out)
    return 0
