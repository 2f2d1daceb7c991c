"""The offline modes: supervised fine-tuning (``sft``) and preference optimisation (``dpo``).

Both subclass :class:`learner.trainer.Trainer`, so FSDP2, AdamW and its schedule, checkpoints with
auto-resume, the Hugging Face export and the step log are the RL mode's. What they add:

- data from ``learner.data`` (see :mod:`learner.offline_data`), read by every rank; a batch is
  ``train_batch_size`` examples (sft rows, dpo pairs) at the current *data position*, and each
  rank trains on a contiguous share of it in micro-batches of ``micro_batch_size`` (a rank with
  fewer rows runs empty micro-batches so the FSDP collectives stay in step);
- the data position is saved with every checkpoint, so a resumed run continues mid-epoch with the
  very next example;
- losses normalised by the whole batch (tokens for sft, pairs for dpo) and scaled by the world
  size (FSDP averages gradients), so ranks and micro-batches add up to the full-batch loss;
- an evaluation on ``learner.data.eval_path`` before training, every ``eval_every`` steps and at the
  end (``"kind": "eval"`` records in ``metrics.jsonl``); sft stops early at the first one whose
  ``eval_exact`` reaches ``learner.data.stop_exact`` (the warm start's target);
- no weight push: there are no engines to feed.

sft loss: mean negative log-likelihood of the response tokens (answer + EOS) over the batch's
response tokens; prompt tokens carry no loss. Its evaluation also reports ``eval_exact``: the share
of held-out rows greedy decoding would answer exactly (every response token the argmax given the
reference prefix), and ``eval_exact/<value>`` per value of ``learner.data.group_key``.

dpo: sequence log-probabilities (sums over response tokens) of the chosen and the rejected
response under the policy and under a frozen reference (the start model, sharded the same way —
with LoRA the policy with its adapters disabled —
evaluated once per batch without gradients) → ``learner.algorithms.dpo_loss``. Metrics: loss,
reward accuracy, chosen/rejected rewards β(π − ref), margin, and ``kl``: the mean per-token
log-ratio log π − log π_ref on the pairs' response tokens (a k1 estimate on the data, not on
samples from the policy).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from dynamo_rl.config import ExperimentConfig
from learner import algorithms as A
from learner.batch import MicroBatch, Sample, collate, micro_splits, num_micro, rank_share
from learner.dist import all_reduce_sum
from learner.model import PolicyModel
from learner.offline_data import DataOrder, PrefExample, SftExample, load_examples
from learner.push import PushResult
from learner.trainer import Trainer

log = logging.getLogger(__name__)

# Mode-specific gauges (dynamo_learner_<key>), registered next to the shared ones.
EXTRA_GAUGES = {
    "reward_accuracy": "dpo: fraction of pairs whose chosen reward exceeds the rejected one",
    "reward_chosen": "dpo: mean β(log π − log π_ref) of the chosen responses",
    "reward_rejected": "dpo: mean β(log π − log π_ref) of the rejected responses",
    "reward_margin": "dpo: mean chosen − rejected reward",
    "data_position": "examples consumed so far (the resume position)",
    "epoch": "data epoch of the last batch",
}


def exact_matches(
    logits: torch.Tensor, response_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``[b]`` booleans: every response token under ``mask`` is the argmax of its logits
    (``[b, T, V]``, each position predicting ``response_ids[:, t]`` from the reference prefix) —
    exactly when greedy decoding writes the reference response, EOS included."""
    wrong = (logits.argmax(-1) != response_ids) & mask.bool()
    return ~wrong.any(-1)


class OfflineTrainer(Trainer):
    """Shared by sft and dpo: data, its order and position, micro-batch plan, evaluation."""

    mode = "offline"

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        from transformers import AutoTokenizer

        dc = self.lc.data
        tokenizer = AutoTokenizer.from_pretrained(self.lc.model)
        assert dc.path is not None  # the config requires it in these modes
        self.examples = self._load(dc.path, tokenizer)
        self.eval_examples = self._load(dc.eval_path, tokenizer) if dc.eval_path else []
        self.order = DataOrder(len(self.examples), cfg.run.seed, dc.shuffle)
        self.position = 0
        self.last_eval_step: int | None = None
        if self.max_position is not None and self.env.is_main:
            log.info("%d examples, %d epochs", len(self.examples), dc.epochs)
        if self.metrics is not None:
            for key, doc in EXTRA_GAUGES.items():
                self.metrics.gauges[key] = self.metrics.metrics.gauge(key, doc)

    def _load(self, path: str, tokenizer: Any) -> list[Any]:
        examples = load_examples(path, tokenizer, self.lc.data, self.lc.mode)
        limit = self.lc.max_seq_len
        kept = [e for e in examples if self.seq_len(e) <= limit]
        if len(kept) < len(examples) and self.env.is_main:
            self.notices.warn(
                log, "examples_too_long",
                f"{path}: {len(examples) - len(kept)} of {len(examples)} examples longer than "
                f"learner.max_seq_len ({limit}) left out",
                path,
            )  # fmt: skip
        if not kept:
            raise ValueError(f"learner.max_seq_len: every example of {path} is longer")
        return kept

    @staticmethod
    def seq_len(example: Any) -> int:
        raise NotImplementedError

    @property
    def max_position(self) -> int | None:
        """Where the data ends when ``learner.max_steps`` is null (``data.epochs`` passes)."""
        if self.lc.max_steps is not None:
            return None
        return self.lc.data.epochs * len(self.examples)

    # --- checkpoint hooks --------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        return {"data_position": self.position}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.position = int(state.get("data_position", 0))

    # --- no engines to push to ---------------------------------------------------------------

    def push(self) -> PushResult | None:
        return None

    # --- the loop ----------------------------------------------------------------------------

    def next_batch(self) -> dict[str, Any] | None:
        every, target = self.lc.data.eval_every, self.lc.data.stop_exact
        if self.eval_examples and (
            self.last_eval_step is None or (every and self.step % every == 0)
        ):
            record = self.evaluate()
            # Every rank reads the same all-reduced figure, so they stop at the same step (the
            # config refuses stop_exact in dpo, whose evaluation has no eval_exact).
            if target is not None and record["eval_exact"] >= target:
                if self.env.is_main:
                    log.info("eval_exact %.4f reached learner.data.stop_exact %.4f at step %d: "
                             "stopping", record["eval_exact"], target, self.step)  # fmt: skip
                return None
        end = self.max_position
        size = self.lc.train_batch_size
        if end is not None:
            size = min(size, end - self.position)
            if size <= 0:
                return None
        indices = self.order.batch(self.position, size)
        batch = {
            "indices": indices,
            "position": self.position,
            "epoch": self.position // len(self.examples),
        }
        self.position += size
        return batch

    def run(self) -> int:
        code = super().run()
        if self.eval_examples and self.last_eval_step != self.step:
            self.evaluate()
        return code

    def plan(self, n: int) -> list[list[int]]:
        """This rank's micro-batches (positions into the batch) for a batch of ``n`` examples."""
        env, micro = self.env, self.lc.micro_batch_size
        rows = list(range(n))
        mine = rank_share(rows, env.rank, env.world_size)
        return micro_splits(mine, micro, num_micro(rows, env.world_size, micro))

    def seq_logp(self, model: PolicyModel, mb: MicroBatch) -> torch.Tensor:
        """Token log-probs ``[b, T]`` of the micro-batch's responses (0 at padding)."""
        logits, _ = model(mb.input_ids, mb.attention_mask, mb.response_len)
        return A.token_logprobs(logits, mb.response_ids) * mb.mask

    def collate(self, pairs: list[tuple[list[int], list[int]]]) -> MicroBatch:
        samples = [Sample(p, r, [0.0] * len(r), 0.0, False, 0) for p, r in pairs]
        return collate(samples, list(range(len(samples))), self.pad_id).to(self.env.device)

    def finish_record(self, record: dict[str, Any], batch: dict[str, Any], t0: float) -> None:
        record["lr"] = float(self.optimizer.param_groups[0]["lr"])
        record["data_position"] = batch["position"] + len(batch["indices"])
        record["epoch"] = batch["epoch"]
        record["examples"] = len(batch["indices"])
        elapsed = time.perf_counter() - t0
        record["tokens_per_second"] = record.get("tokens", 0) / max(elapsed, 1e-9)

    def evaluate(self) -> dict[str, Any]:
        """Collective: metrics on the held-out examples, written as an eval record."""
        was_training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            record = self.eval_metrics()
        if was_training:
            self.model.train()
        record.update(kind="eval", step=self.step, time_eval=time.perf_counter() - t0)
        self.last_eval_step = self.step
        if self.env.is_main:
            assert self.steplog is not None
            self.steplog.write(record)
            shown = " ".join(
                f"{k} {v:.4f}" for k, v in record.items() if k.startswith("eval_")
            )  # fmt: skip
            log.info("eval at step %d: %s", self.step, shown)
        return record

    def eval_metrics(self) -> dict[str, Any]:
        raise NotImplementedError


class SFTTrainer(OfflineTrainer):
    """Supervised fine-tuning: NLL of the response tokens."""

    mode = "sft"

    @staticmethod
    def seq_len(example: SftExample) -> int:
        return len(example.prompt) + len(example.response)

    def _nll_sums(
        self,
        examples: list[SftExample],
        train: bool,
        total_tokens: float,
        exact: dict[str | None, list[float]] | None = None,
    ) -> tuple[float, float]:
        """(summed NLL, tokens) of this rank's share; backward of the normalised loss if
        ``train``. With ``exact``, adds [exact matches, rows] per example group: a row matches
        when every response token (EOS included) is the model's argmax given the reference
        prefix — exactly when greedy decoding writes the reference response."""
        nll_sum = tok_sum = 0.0
        world = self.env.world_size
        for rows in self.plan(len(examples)):
            mb = self.collate([(examples[i].prompt, examples[i].response) for i in rows])
            logits, _ = self.model(mb.input_ids, mb.attention_mask, mb.response_len)
            logp = A.token_logprobs(logits, mb.response_ids) * mb.mask
            nll = -logp.sum()
            if train:  # a dummy (no rows) backpropagates 0 to keep the collectives in step
                (nll * (world / total_tokens)).backward()
            if rows:
                nll_sum += float(nll.detach())
                tok_sum += float(mb.mask.sum())
            if exact is not None and rows:
                matched = exact_matches(logits, mb.response_ids, mb.mask)
                for i, ok in zip(rows, matched.tolist(), strict=True):
                    hits = exact.setdefault(examples[i].group, [0.0, 0.0])
                    hits[0] += float(ok)
                    hits[1] += 1.0
        return nll_sum, tok_sum

    def train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        examples = [self.examples[i] for i in batch["indices"]]
        total = float(sum(len(e.response) for e in examples))
        nll, tokens = self._nll_sums(examples, True, total)
        t1 = time.perf_counter()
        grad_norm = self.optimizer_step()
        nll, tokens = all_reduce_sum([nll, tokens])
        record: dict[str, Any] = {
            "loss": nll / max(tokens, 1.0),
            "grad_norm": grad_norm,
            "tokens": int(tokens),
            "time_forward_backward": t1 - t0,
            "time_optimizer": time.perf_counter() - t1,
        }
        self.finish_record(record, batch, t0)
        return record

    def eval_metrics(self) -> dict[str, Any]:
        exact: dict[str | None, list[float]] = {}
        sums = list(self._nll_sums(self.eval_examples, False, 1.0, exact))
        # Every rank knows every group (all hold the same examples): reduce in one fixed order.
        groups = sorted({e.group for e in self.eval_examples if e.group is not None})
        for g in [None, *groups]:
            sums += exact.get(g, [0.0, 0.0])
        nll, tokens, *counts = all_reduce_sum(sums)
        hits = [sum(counts[0::2]), sum(counts[1::2])]
        record = {
            "eval_loss": nll / max(tokens, 1.0),
            "eval_tokens": int(tokens),
            "eval_exact": hits[0] / max(hits[1], 1.0),
        }
        for j, g in enumerate(groups, 1):
            record[f"eval_exact/{g}"] = counts[2 * j] / max(counts[2 * j + 1], 1.0)
        return record


class DPOTrainer(OfflineTrainer):
    """Direct preference optimisation against a frozen reference (the start model)."""

    mode = "dpo"

    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        self.load_reference()

    @staticmethod
    def seq_len(example: PrefExample) -> int:
        return len(example.prompt) + max(len(example.chosen), len(example.rejected))

    def _pairs(self, examples: list[PrefExample], train: bool) -> dict[str, float]:
        """Sums over this rank's pairs (metrics × pairs); backward of the normalised loss."""
        d = self.lc.dpo
        n_total = len(examples)
        world = self.env.world_size
        sums = dict.fromkeys(
            ("loss", "reward_accuracy", "reward_chosen", "reward_rejected", "reward_margin",
             "kl", "kl_tokens", "pairs", "tokens"), 0.0)  # fmt: skip
        for rows in self.plan(n_total):
            k = len(rows)
            seqs = [(examples[i].prompt, examples[i].chosen) for i in rows]
            seqs += [(examples[i].prompt, examples[i].rejected) for i in rows]
            mb = self.collate(seqs)
            with torch.no_grad(), self.as_reference() as ref:
                ref_tok = self.seq_logp(ref, mb)
            pol_tok = self.seq_logp(self.model, mb)
            if not rows:
                if train:
                    (pol_tok.sum() * 0.0).backward()
                continue
            pol, ref = pol_tok.sum(-1), ref_tok.sum(-1)
            loss, m = A.dpo_loss(
                pol[:k], pol[k:], ref[:k], ref[k:],
                beta=d.beta, kind=d.kind, label_smoothing=d.label_smoothing,
            )  # fmt: skip
            if train:
                (loss * (k * world / n_total)).backward()
            sums["loss"] += float(loss.detach()) * k
            for key, value in m.items():
                sums[key] += float(value) * k
            sums["kl"] += float(((pol_tok.detach() - ref_tok) * mb.mask).sum())
            sums["kl_tokens"] += float(mb.mask.sum())
            sums["pairs"] += k
        sums["tokens"] = sums["kl_tokens"]
        return sums

    def _finish(self, sums: dict[str, float], prefix: str = "") -> dict[str, Any]:
        keys = sorted(sums)
        total = dict(zip(keys, all_reduce_sum([sums[k] for k in keys]), strict=True))
        pairs = max(total["pairs"], 1.0)
        out: dict[str, Any] = {
            f"{prefix}{k}": total[k] / pairs
            for k in ("loss", "reward_accuracy", "reward_chosen", "reward_rejected",
                      "reward_margin")
        }  # fmt: skip
        out[f"{prefix}kl"] = total["kl"] / max(total["kl_tokens"], 1.0)
        out[f"{prefix}pairs"] = int(total["pairs"])
        out[f"{prefix}tokens"] = int(total["tokens"])
        return out

    def train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        examples = [self.examples[i] for i in batch["indices"]]
        sums = self._pairs(examples, True)
        t1 = time.perf_counter()
        grad_norm = self.optimizer_step()
        record = self._finish(sums)
        record.update(
            grad_norm=grad_norm,
            time_forward_backward=t1 - t0,
            time_optimizer=time.perf_counter() - t1,
        )
        self.finish_record(record, batch, t0)
        return record

    def eval_metrics(self) -> dict[str, Any]:
        return self._finish(self._pairs(self.eval_examples, False), prefix="eval_")


MODES: dict[str, type[OfflineTrainer]] = {"sft": SFTTrainer, "dpo": DPOTrainer}
