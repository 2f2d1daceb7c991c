"""A reward-model worker: one process per ``reward.models.<name>``, started by the reward service.

The reward service never imports torch (its import-linter contract): it is a network-facing,
many-process service (math workers are forked from it) and must start in a second. So a
sequence-classification reward model runs here, in a child process that speaks JSON lines over
its stdin/stdout pipes, the same way the service would talk to any other scoring backend:

- on start, one line: ``{"ready": true, "device": ..., "dtype": ...}``, or ``{"error": "..."}``
  and exit status 1 (not a model directory, ``num_labels`` is not 1, no such device);
- then, per request line ``{"pairs": [[prompt, response], ...]}``, one answer line
  ``{"scores": [raw, ...]}`` (same order) or ``{"error": "..."}``.

The text of a pair is the prompt followed by the response (``plain``), or the tokenizer's chat
template over a user and an assistant message (``chat``). A batch is right-padded; the model reads
its score at the last non-padding token, so a pair scores the same alone or in a batch.
Everything else the libraries print goes to stderr: stdout carries the protocol only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def _texts(tokenizer: Any, pairs: list[list[str]], template: str) -> list[str]:
    if template == "chat":
        return [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                tokenize=False,
            )
            for p, r in pairs
        ]
    return [p + r for p, r in pairs]


class RewardModel:
    """The loaded model and tokenizer; :meth:`score` is one batched forward pass."""

    def __init__(self, path: str, device: str, dtype: str, max_length: int, template: str) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, dtype)
        )
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{path}: expected a reward model with num_labels=1, got "
                f"{self.model.config.num_labels}"
            )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            # Needed to find each row's last real token in a padded batch.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if template == "chat" and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{path}: template 'chat' but the tokenizer has no chat template")
        self.tokenizer.padding_side = "right"
        self.model.to(device).eval()
        self.device = device
        self.max_length = max_length
        self.template = template

    def score(self, pairs: list[list[str]]) -> list[float]:
        enc = self.tokenizer(
            _texts(self.tokenizer, pairs, self.template),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        ).to(self.device)
        with self.torch.inference_mode():
            logits = self.model(**enc).logits
        return [float(x) for x in logits[:, 0].float().cpu()]


def serve(model: RewardModel, inp: TextIO, out: TextIO) -> None:
    for line in inp:
        try:
            request = json.loads(line)
            pairs = request["pairs"]
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ValueError("pairs must be [prompt, response] lists")
            answer: dict[str, Any] = {"scores": model.score(pairs) if pairs else []}
        except Exception as e:  # one bad batch must not end the worker
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--template", default="plain", choices=["plain", "chat"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    # The protocol owns the real stdout; anything printed by libraries goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    try:
        import torch

        torch.set_num_threads(args.threads)
        model = RewardModel(args.path, args.device, args.dtype, args.max_length, args.template)
    except Exception as e:
        protocol.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        protocol.flush()
        return 1
    protocol.write(json.dumps({"ready": True, "device": args.device, "dtype": args.dtype}) + "\n")
    protocol.flush()
    serve(model, sys.stdin, protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
