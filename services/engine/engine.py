"""The engine: a loaded model, its batch loop, and requests turned into sequences.

:class:`Engine` loads nothing itself (:func:`load_model` does) and speaks no HTTP (the routes,
:mod:`.routes`, call it): it turns a validated request into sequences for the batch loop
(:class:`~.batch_loop.BatchGenerator`) — the one place a request's sampling fields
(:class:`~dynamo_rl.contracts.engine.SamplingKnobs`, either API) become each sequence's
:class:`~dynamo_rl.contracts.sampling.SamplingParams` — and checks what needs the model (token
ids inside the vocabulary, the context length, the engine's caps; :class:`InvalidRequest` names
the field). The weight updates of both protocols and the LoRA adapter loads are its
:attr:`Engine.updates` (:mod:`.weight_updates`); the adapters a request names are loaded beside
the base weights (:mod:`.adapters`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from dynamo_rl.config.engine import EngineConfig
from dynamo_rl.contracts.chat import (
    MessageError,
    chat_messages,
)
from dynamo_rl.contracts.engine import (
    EngineRegistry,
    PromptInput,
    SamplingKnobs,
)
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.contracts.weight_control import VLLMInitRequest, adapter_version
from dynamo_rl.prompts import render_prompt
from services.engine.adapters import Adapters
from services.engine.batch_loop import BatchGenerator, BatchStats
from services.engine.metrics import EngineMetrics
from services.engine.sampler import sample_seed
from services.engine.weight_updates import WeightUpdates
from services.engine.weights import parse_dtype

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class InvalidRequest(Exception):
    """A request that is well-formed JSON but asks for something this model cannot do: a 422
    naming ``field``, or ``status`` (400: chat messages the model cannot render, as vLLM)."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load a Hugging Face causal LM and its tokenizer from a local directory (no hub access)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"engine.model: {str(path)!r} is not a Hugging Face model directory"
        )
    torch_dtype: Any = "auto" if dtype == "auto" else TORCH_DTYPES[dtype]
    major_minor = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    key = "dtype" if major_minor >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **{key: torch_dtype})
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


class Engine:
    """A loaded model, its batch generator, weight-update groups and Redis registration."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: EngineConfig,
        served_model_name: str,
        control_token: str | None = None,
        registry: EngineRegistry | None = None,
        seed: int = 0,
        interruptible: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.served_model_name = served_model_name
        self.control_token = control_token
        self.registry = registry
        self.metrics = EngineMetrics()
        mc = model.config
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_context = int(getattr(mc, "max_position_embeddings", 0) or 1 << 30)
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), mc):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list):
                eos.update(int(v) for v in value)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = getattr(mc, "pad_token_id", None)
        if pad is None:
            pad = min(eos) if eos else 0
        self.params = dict(model.state_dict())
        self.adapters = Adapters(model, served_model_name, cfg.max_lora_rank)
        self.generator = BatchGenerator(
            model,
            eos_token_ids=sorted(eos),
            pad_token_id=int(pad),
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            max_batch_size=cfg.max_batch_size,
            batch_wait_s=cfg.batch_wait_ms / 1000.0,
            seed=seed,
            on_batch=self._on_batch,
            logprobs_mode=cfg.logprobs_mode,
            select_adapter=self._select_adapter,
            batching=cfg.batching,
        )
        self.updates = WeightUpdates(
            self.generator, self.params, self.adapters, cfg, self.metrics, registry,
            interruptible=interruptible,
        )  # fmt: skip
        """Both weight-update protocols and the adapter loads (``interruptible``: SGLang-shaped
        updates at the running batch's next token boundary, ``rollout.update_mode: interrupt``)."""

    @property
    def weight_version(self) -> int:
        return self.generator.weight_version

    def close(self) -> None:
        self.updates.resume()
        self.generator.close()
        self.updates.close()

    def _on_batch(self, stats: BatchStats) -> None:
        m = self.metrics
        m.batch_size.observe(stats.rows or stats.sequences)
        m.batch_seconds.observe(stats.seconds)
        m.sequences.inc(stats.sequences)
        m.prompt_tokens.inc(stats.prompt_tokens)
        m.generated_tokens.inc(stats.generated_tokens)
        if stats.seconds > 0:
            m.tokens_per_second.set(stats.generated_tokens / stats.seconds)

    # ---- requests -> sequences ----

    def encode_prompts(self, prompt: PromptInput, field: str) -> list[list[int]]:
        """Token ids of each prompt; raises InvalidRequest naming ``field`` for bad ones."""
        if isinstance(prompt, str):
            texts: list[str] | None = [prompt]
        elif prompt and all(isinstance(p, str) for p in prompt):
            texts = list(prompt)  # type: ignore[arg-type]
        else:
            texts = None
        if texts is not None:
            prompts = [self.tokenizer.encode(t) for t in texts]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]  # type: ignore[arg-type]
        else:
            prompts = [list(p) for p in prompt]  # type: ignore[union-attr]
        for i, ids in enumerate(prompts):
            if not ids:
                raise InvalidRequest(field, f"prompt {i} has no tokens")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequest(
                    field, f"token id {bad[0]} out of range [0, {self.vocab_size}) (prompt {i})"
                )
            if len(ids) >= self.max_context:
                raise InvalidRequest(
                    field,
                    f"prompt {i} has {len(ids)} tokens; the model's context is {self.max_context}",
                )
        return prompts

    def render_chat(self, messages: list[Any]) -> list[int]:
        """The token ids of chat ``messages`` rendered by the tokenizer's chat template with the
        generation prompt, as the rollout worker renders a chat prompt
        (:func:`dynamo_rl.prompts.render_prompt`). A tokenizer without a template, a malformed
        message (:func:`~dynamo_rl.contracts.engine.chat_messages`) or one the template refuses
        is a 400 naming the field, as vLLM answers."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequest(
                "messages",
                "the served model's tokenizer has no chat template (chat_template in its "
                "tokenizer_config.json or chat_template.jinja); send rendered prompts to "
                "/v1/completions instead",
                status=400,
            )
        try:
            _, ids = render_prompt(self.tokenizer, chat_messages(messages), "chat")
        except MessageError as e:
            raise InvalidRequest(e.field, e.message, status=400) from None
        except Exception as e:  # the template's own refusal (jinja2 errors, raise_exception)
            raise InvalidRequest(
                "messages", f"the chat template cannot render them: {e}", status=400
            ) from None
        return ids

    def resolve_max_tokens(
        self, requested: int | None, prompts: list[list[int]], field: str
    ) -> int:
        longest = max(len(p) for p in prompts)
        room = self.max_context - longest
        if requested is None:
            return min(self.cfg.default_max_tokens, self.cfg.max_new_tokens, room)
        if requested > self.cfg.max_new_tokens:
            raise InvalidRequest(
                field,
                f"{requested} exceeds this engine's limit {self.cfg.max_new_tokens} "
                "(engine.max_new_tokens)",
            )
        if requested > room:
            raise InvalidRequest(
                field,
                f"{requested} new tokens after a {longest}-token prompt exceed the model's "
                f"context of {self.max_context}",
            )
        return requested

    def check_token_ids(self, ids: Sequence[int] | None, field: str) -> tuple[int, ...]:
        ids = tuple(ids or ())
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(field, f"token id {bad[0]} out of range [0, {self.vocab_size})")
        return ids

    def check_top_logprobs(self, k: int | None, field: str) -> int:
        if k is not None and k > self.cfg.max_logprobs:
            raise InvalidRequest(
                field,
                f"{k} exceeds this engine's limit {self.cfg.max_logprobs} (engine.max_logprobs)",
            )
        return k or 0

    def sequences(
        self,
        prompts: list[list[int]],
        knobs: SamplingKnobs,
        *,
        max_tokens: int,
        seed: int | None,
        seed_per_prompt: bool = False,
        prefix: str = "",
    ) -> tuple[list[list[int]], list[SamplingParams]]:
        """``knobs.n`` sequences per prompt and how to sample each: the one mapping from a
        request's sampling fields to the settings of its sequences. Sample ``k`` of a seeded
        request gets ``sample_seed(seed, k)``, ``k`` counting across prompts (OpenAI) or within
        each prompt (``seed_per_prompt``, SGLang)."""
        self.check_token_ids(knobs.stop_token_ids, prefix + "stop_token_ids")
        sampling = knobs.sampling(max_tokens)
        seqs, params = [], []
        for i, ids in enumerate(prompts):
            for j in range(knobs.n):
                k = j if seed_per_prompt else i * knobs.n + j
                seqs.append(ids)
                own = None if seed is None else sample_seed(seed, k)
                params.append(dataclasses.replace(sampling, seed=own))
        return seqs, params

    def score_prompts(
        self, prompts: list[list[int]], adapter: str | None
    ) -> Future[list[list[tuple[float, int]]]]:
        """``prompt_logprobs``: for each prompt, (log-prob, rank) of every token after its first
        under the model (``adapter``'s), from one uncached forward pass per prompt and the raw
        logits (no temperature, as vLLM's prompt log-probs). Runs in the scheduler thread between
        batches, as the weight updates do, so it never interleaves with a decoding step."""

        def run() -> list[list[tuple[float, int]]]:
            self.adapters.select(adapter)
            out = []
            with torch.inference_mode():
                for ids in prompts:
                    x = torch.tensor([ids], device=self.generator.device)
                    logp = torch.log_softmax(self.model(input_ids=x).logits[0, :-1].float(), -1)
                    own = logp.gather(1, x[0, 1:, None])
                    ranks = (logp > own).sum(1) + 1
                    out.append(list(zip(own[:, 0].tolist(), ranks.tolist(), strict=True)))
            return out

        return self.generator.run_exclusive(run)

    def decode_text(self, ids: list[int], matched: int | str | None, skip_special: bool) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
        if isinstance(matched, str):
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    # ---- LoRA adapters (services/engine/adapters.py) ----

    def _select_adapter(self, name: str | None) -> int | None:
        """Scheduler thread, before a batch: run ``name``'s adapter; the version it carries."""
        self.adapters.select(name)
        return None if name is None else self.adapters.loaded[name]

    def resolve_adapter(self, name: str | None, field: str) -> str | None:
        """The adapter a request names (None: the base model). A versioned adapter name that is
        not loaded is refused, naming the loaded ones; other names mean the base, as before."""
        if name is None or name == self.served_model_name:
            return None
        if name in self.adapters.loaded:
            return name
        if adapter_version(name) is not None:
            loaded = ", ".join(self.adapters.names()) or "none"
            raise InvalidRequest(field, f"adapter {name!r} is not loaded (loaded: {loaded})")
        return None

    # ---- checks of weight-update requests ----

    @staticmethod
    def check_tensors(
        names: list[str], dtypes: list[str], shapes: list[Any], prefix: str, dtypes_field: str
    ) -> None:
        """One dtype and one shape per name, each dtype one this engine loads."""
        n = len(names)
        if len(dtypes) != n or len(shapes) != n:
            raise InvalidRequest(
                f"{prefix}names", f"names, {dtypes_field} and shapes differ in length ({n}, "
                f"{len(dtypes)}, {len(shapes)})"
            )  # fmt: skip
        for i, d in enumerate(dtypes):
            try:
                parse_dtype(d)
            except ValueError as e:
                raise InvalidRequest(f"{prefix}{dtypes_field}.{i}", str(e)) from None

    @staticmethod
    def check_transfer_init(req: VLLMInitRequest) -> None:
        """vLLM nccl's packed layout is not taken (flat buckets are ``bucket_bytes``)."""
        if req.init_info.packed:
            raise InvalidRequest(
                "init_info.packed",
                "this engine does not take vLLM nccl's packed layout (packed=false; flat "
                "buckets are bucket_bytes)",
            )
