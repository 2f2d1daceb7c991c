"""The learner's section: model, optimisation, algorithm, stream, checkpoints and weight push.

The algorithm is data: ``learner.algorithm.advantage`` and ``learner.algorithm.policy_loss`` are
pydantic unions keyed on ``type`` (one class per variant, each with only the knobs it has), and the
learner looks each ``type`` up in the registries of ``learner.algorithms``. Combinations that make
no sense (GSPO with dual-clip, PPO/GAE without a critic, a KL term without a reference, DAPO
dynamic sampling without groups) are rejected here, before anything starts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port

Aggregation = Literal[
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "prompt-mean",
]
Fraction = Annotated[float, Field(ge=0, le=1)]
IsMode = Literal[
    "token-truncate",
    "sequence-truncate",
    "geometric-truncate",
    "token-mask",
    "sequence-mask",
    "geometric-mask",
]
"""Names of ``learner.algorithms.IS_CORRECTIONS`` (a test checks the two agree)."""


def _type_or(default: str):
    """A discriminator that reads ``type`` and falls back to ``default`` when it is missing, so
    ``learner.algorithm.policy_loss.clip_high=0.28`` alone tunes the default variant."""

    def pick(value: object) -> str:
        if isinstance(value, dict):
            return str(value.get("type", default))
        return str(getattr(value, "type", default))

    return Discriminator(pick)


# --- advantage estimators (names match learner.algorithms.ADVANTAGE_ESTIMATORS) ---------------


class GrpoAdvantage(Section):
    type: Literal["grpo"] = "grpo"
    """Group-relative advantages: (r − group mean) / group std."""


class DrGrpoAdvantage(Section):
    type: Literal["drgrpo"] = "drgrpo"
    """Dr.GRPO: r − group mean, not divided by the std."""


class RlooAdvantage(Section):
    type: Literal["rloo"] = "rloo"
    """Leave-one-out baseline within each group."""


class ReinforcePPAdvantage(Section):
    type: Literal["reinforce_pp"] = "reinforce_pp"
    """REINFORCE++: discounted token returns whitened over the batch."""
    gamma: Fraction = 1.0
    """Discount factor."""
    group_baseline: bool = False
    """Subtract the group mean first (the REINFORCE++-baseline variant)."""

    @property
    def registry_name(self) -> str:
        return "reinforce_pp_baseline" if self.group_baseline else "reinforce_pp"


class GaeAdvantage(Section):
    type: Literal["gae"] = "gae"
    """PPO's GAE over a critic's values (needs ``learner.critic``)."""
    gamma: Fraction = 1.0
    """Discount factor."""
    lam: Fraction = 0.95
    """GAE λ."""


Advantage = Annotated[
    Annotated[GrpoAdvantage, Tag("grpo")]
    | Annotated[DrGrpoAdvantage, Tag("drgrpo")]
    | Annotated[RlooAdvantage, Tag("rloo")]
    | Annotated[ReinforcePPAdvantage, Tag("reinforce_pp")]
    | Annotated[GaeAdvantage, Tag("gae")],
    _type_or("grpo"),
]


# --- policy losses (names match learner.algorithms.POLICY_LOSSES) -----------------------------


class PpoLoss(Section):
    type: Literal["ppo"] = "ppo"
    """Token-level clipped surrogate."""
    clip_low: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """Lower clip ε: the ratio is clipped at 1 − clip_low."""
    clip_high: Annotated[float, Field(gt=0)] = 0.2
    """Upper clip ε (clip-higher when above clip_low): the ratio is clipped at 1 + clip_high."""
    dual_clip: Annotated[float, Field(gt=1)] | None = None
    """Dual-clip constant c > 1 bounding the loss of negative advantages; null: off."""


class GspoLoss(Section):
    type: Literal["gspo"] = "gspo"
    """Sequence-level ratio (GSPO), always aggregated seq-mean-token-mean."""
    clip_low: Annotated[float, Field(gt=0, lt=1)] = 3e-4
    """Lower clip ε on the sequence ratio."""
    clip_high: Annotated[float, Field(gt=0)] = 4e-4
    """Upper clip ε on the sequence ratio."""
    dual_clip: float | None = None
    """Not available with GSPO (accepted only so that setting it gives a clear error)."""


PolicyLoss = Annotated[
    Annotated[PpoLoss, Tag("ppo")] | Annotated[GspoLoss, Tag("gspo")], _type_or("ppo")
]


class KlConfig(Section):
    """KL to a frozen reference model, in the loss and/or in the reward."""

    coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the KL term in the loss; 0: off (no reference model unless kl_in_reward)."""
    kind: Literal["k1", "abs", "k2", "k3", "low_var_kl"] = "k3"
    """KL estimator of the loss term."""
    in_reward_coef: Annotated[float, Field(ge=0)] = 0.0
    """Initial β of KL-in-reward (token reward −β·(logp_old − logp_ref)); GAE only; 0: off."""
    target: Annotated[float, Field(gt=0)] | None = None
    """Target KL of the adaptive β controller (PPO's); null: β stays fixed."""
    horizon: Annotated[int, Field(ge=1)] = 10000
    """Horizon of the adaptive controller, in responses."""


class ModulationConfig(Section):
    """DynaMO gradient-aware advantage modulation (applied per micro-batch)."""

    enabled: bool = False
    """Modulate token advantages by entropy (β_comp) and estimated entropy change (β_stab)."""
    preset: Literal["decay6", "decay5"] = "decay6"
    """Constants preset (decay6: λ_min 0.6, γ 50, τ 0.99, μ_max 1.2; decay5: τ 0.9, μ_max 1.4)."""
    lambda_min: Annotated[float, Field(gt=0, le=1)] | None = None
    """Override of the preset's λ_min."""
    gamma: Annotated[float, Field(gt=0)] | None = None
    """Override of the preset's sigmoid sharpness γ."""
    tau: Annotated[float, Field(gt=0)] | None = None
    """Override of the preset's sigmoid midpoint τ."""
    mu_max: Annotated[float, Field(ge=1)] | None = None
    """Override of the preset's μ_max."""

    def overrides(self) -> dict[str, float]:
        names = ("lambda_min", "gamma", "tau", "mu_max")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class DapoConfig(Section):
    """DAPO's dynamic sampling and overlong reward shaping."""

    dynamic_sampling: bool = False
    """Skip groups whose rewards are all equal and keep reading until the batch is full."""
    max_reads: Annotated[int, Field(ge=1)] = 8
    """Bound on stream reads per batch while filling it (then train on what was kept)."""
    overlong_buffer: Annotated[int, Field(ge=0)] = 0
    """Soft overlong punishment buffer in tokens; 0: off."""
    overlong_factor: Annotated[float, Field(ge=0)] = 1.0
    """Penalty at the maximum length (linear inside the buffer)."""
    max_response_len: Annotated[int, Field(ge=1)] | None = None
    """Maximum response length the engine was asked for (needed by overlong shaping)."""


class OpdConfig(Section):
    """On-policy distillation (``docs/learner.md``): the per-token advantage
    −(log π_student − log π_teacher) on the student's own samples, the sampling log-prob standing
    for the student's and the teacher's log-probs scored by ``rollout.teacher``, mixed into the
    outcome advantage: ``outcome_weight · A_outcome + weight · A_opd`` per token."""

    weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    """Weight of the distillation advantage; 0: off. On, every trained response must carry the
    teacher's log-probs (``rollout.teacher``)."""
    outcome_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Weight of the outcome advantage (``advantage.type``'s) in the mix; 0: pure distillation.
    Only used with ``weight`` > 0."""

    @model_validator(mode="after")
    def _check(self) -> OpdConfig:
        if self.weight == 0 and self.outcome_weight != 1.0:
            raise ValueError(
                f"learner.algorithm.opd.outcome_weight ({self.outcome_weight}) is only used with "
                "learner.algorithm.opd.weight > 0"
            )
        return self


class AlgorithmConfig(Section):
    """Which advantage estimator, policy loss and extras the learner uses."""

    advantage: Advantage = GrpoAdvantage()
    """Advantage estimator, keyed on ``type``: grpo, drgrpo, rloo, reinforce_pp, gae."""
    policy_loss: PolicyLoss = PpoLoss()
    """Policy loss, keyed on ``type``: ppo, gspo."""
    agg: Aggregation = "token-mean"
    """Loss aggregation over tokens (GSPO always uses seq-mean-token-mean). ``token-mean`` weighs
    every token alike, so a prompt's weight grows with its number of responses; ``prompt-mean``
    (token-mean within each prompt's group, mean over the mini-batch's groups) weighs every prompt
    alike whatever its n — the weighting under which dynamic allocation lowers the gradient's
    variance (DynaMO's recipes use it)."""
    kl: KlConfig = KlConfig()
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    """Entropy bonus weight (subtracted from the loss)."""
    modulation: ModulationConfig = ModulationConfig()
    dapo: DapoConfig = DapoConfig()
    opd: OpdConfig = OpdConfig()
    is_cap: Annotated[float, Field(ge=1)] | None = 2.0
    """Cap of the importance weight built from r = exp(logp_old − logp_sampling) that corrects the
    engine/learner mismatch and staleness (the upper edge of the band in the masked modes); null:
    no correction."""
    is_mode: IsMode = "token-truncate"
    """Which correction: ``<level>-truncate`` weighs by min(ratio, is_cap), ``<level>-mask`` by the
    ratio inside [is_low, is_cap] and drops the tokens outside; the level is ``token`` (each
    token's r), ``sequence`` (the row's Π r, on all its tokens) or ``geometric`` (the row's
    geometric mean of r). ``docs/learner.md`` says when to use which."""
    is_low: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Lower edge of the masked modes' band; null: 1 / is_cap. Only the ``*-mask`` modes use it."""
    train_observations: bool = False
    """Mask ablation (off by default; never for real training): multi-turn samples train their
    observation tokens too — the tool output and template markers the environment added, loss
    mask 0 — as if the model had sampled them (their importance weight 1, since the engine gave
    them no log-prob)."""

    @model_validator(mode="after")
    def _check_is(self) -> AlgorithmConfig:
        if self.is_low is not None and not self.is_mode.endswith("-mask"):
            raise ValueError(
                f"learner.algorithm.is_low is only used by the masked IS modes (token-mask, "
                f"sequence-mask, geometric-mask), not is_mode {self.is_mode!r}"
            )
        return self


class CriticConfig(Section):
    """A value head on the policy's last hidden state (PPO with GAE)."""

    enabled: bool = False
    """Train a value head next to the policy; required by the gae advantage."""
    value_coef: Annotated[float, Field(ge=0)] = 0.5
    """Weight of the value loss."""
    value_clip: Annotated[float, Field(gt=0)] = 0.2
    """Clip range of the value loss around the old values."""


class OptimConfig(Section):
    """AdamW, gradient clipping and the learning-rate schedule (over train steps)."""

    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW decoupled weight decay."""
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    """AdamW betas."""
    eps: Annotated[float, Field(gt=0)] = 1e-8
    """AdamW epsilon."""
    grad_clip: Annotated[float, Field(gt=0)] | None = 1.0
    """Clip the global gradient norm to this; null: no clipping."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Linear warmup from 0 over this many train steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: constant, or cosine decay to min_lr_ratio·lr at total_steps."""
    min_lr_ratio: Fraction = 0.0
    """Floor of the cosine schedule as a fraction of lr."""
    total_steps: Annotated[int, Field(ge=1)] | None = None
    """Length of the cosine schedule; null: learner.max_steps."""


class StreamConfig(Section):
    """How the learner reads the trajectory stream."""

    block_ms: Annotated[int, Field(ge=1)] = 1000
    """XREADGROUP block time per read."""
    wait_timeout_s: Annotated[float, Field(gt=0)] | None = None
    """Stop (after a checkpoint) when no entry arrives for this long; null: wait forever."""
    max_staleness: Annotated[int, Field(ge=0)] | None = None
    """Drop groups sampled more than this many weight versions ago; null: keep all."""


class CheckpointConfig(Section):
    """Distributed checkpoints (torch.distributed.checkpoint) and Hugging Face exports."""

    every: Annotated[int, Field(ge=1)] = 10
    """Checkpoint every this many steps. Stream entries are acknowledged only when the checkpoint
    that holds their step is written, so this also bounds how much is retrained after a crash."""
    keep: Annotated[int, Field(ge=1)] = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    export_every: Annotated[int, Field(ge=0)] = 1
    """Write a Hugging Face export with every n-th checkpoint (and at the end); 0: only at the
    end."""
    dir: str | None = None
    """Checkpoint folder; null: ``<run dir>/checkpoints``."""
    resume: bool = True
    """Resume from the latest checkpoint in ``dir`` when there is one."""


class PushConfig(Section):
    """Pushing the policy's weights to the inference engines (SGLang-shaped endpoints)."""

    every: Annotated[int, Field(ge=0)] = 1
    """Push after every n-th step; 0: never."""
    transport: Literal["distributed", "disk"] = "distributed"
    """distributed: torch.distributed broadcast from rank 0; disk: an HF export the engines load."""
    engines_from: Literal["redis", "config"] = "redis"
    """Where the engine URLs come from: the Redis registry, or endpoints.engine_urls."""
    master_address: str = "127.0.0.1"
    """Address of rank 0 that engines connect to for the broadcast group."""
    bucket_mb: Annotated[float, Field(gt=0)] = 256.0
    """Full parameters gathered per bucket before broadcasting them."""
    timeout_s: Annotated[float, Field(gt=0)] = 300.0
    """Timeout of a group formation or one push."""
    silent_s: Annotated[float, Field(gt=0)] = 30.0
    """An engine in a push that leaves ``GET /health`` unanswered this long is left out of the
    push and caught up at a later one, even while its pulse in Redis says it runs (busy). Not
    lower than the longest stall of a busy engine's HTTP server: a vLLM CPU server sampling for
    16 clients took up to 7 s to answer here (docs/learner.md)."""
    stopped_s: Annotated[float, Field(ge=3)] = 5.0
    """An engine in a push that leaves ``GET /health`` unanswered this long while its pulse in
    Redis stands still as long too (a SIGSTOPped process, a hung host) is left out of the push;
    engines without a pulse (not registered in Redis, SGLang servers) are waited for
    ``silent_s``. At least 3 s (three of the pulse's beats, one a second: a pulse late by a beat
    is not a stop) and at most ``silent_s`` (when not set, lowered to a smaller ``silent_s``)."""
    fallback_to_disk: bool = True
    """When a distributed push fails, export and ask engines to load from disk (not with
    rollout.weight_api=vllm: vLLM's weight-transfer API has no load-from-disk route)."""

    @model_validator(mode="after")
    def _check_stopped(self) -> PushConfig:
        if self.stopped_s > self.silent_s and "stopped_s" not in self.model_fields_set:
            self.stopped_s = self.silent_s
        if self.stopped_s > self.silent_s:
            raise ValueError(
                f"learner.push.stopped_s ({self.stopped_s:g}) must be at most "
                f"learner.push.silent_s ({self.silent_s:g})"
            )
        return self


class DataConfig(Section):
    """Offline data of the ``sft`` and ``dpo`` modes: a JSONL or parquet file of rows.

    Keys are dotted paths into a row (``extra_info.answer``). A prompt is text (used verbatim) or
    chat messages (rendered like the rollout worker renders them: the tokenizer's chat template,
    else the plain ``User: ...\\nAssistant:`` template); the response follows it, then EOS."""

    path: str | None = None
    """Training rows (``.jsonl``/``.json`` lines or ``.parquet``); required by sft and dpo."""
    eval_path: str | None = None
    """Held-out rows evaluated before training, every ``eval_every`` steps and at the end."""
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Evaluate every this many steps (besides before and after); 0: only before and after."""
    stop_exact: Fraction | None = None
    """sft: stop at the first evaluation whose ``eval_exact`` reaches this (``learner.max_steps``
    is then the most it trains); null: train to max_steps. Needs ``eval_path``."""
    prompt_key: str = "prompt"
    """Field holding the prompt (text or chat messages)."""
    response_key: str | None = None
    """sft: field holding the response (text, or messages whose last one is the answer); null:
    the first of ``response``, ``completion``, ``extra_info.answer`` (verl layout) present."""
    messages_key: str = "messages"
    """sft: chat rows without a prompt field: all messages but the last assistant one are the
    prompt, that one is the response."""
    chosen_key: str = "chosen"
    """dpo: field of the preferred response (text, or messages as TRL lays them out)."""
    rejected_key: str = "rejected"
    """dpo: field of the dispreferred response."""
    filter_key: str | None = None
    """Keep only rows whose value at this field is in ``filter_values`` (e.g. extra_info.tier)."""
    filter_values: list[str] | None = None
    """Values kept by ``filter_key`` (compared as strings)."""
    group_key: str | None = None
    """sft: the evaluation also reports ``eval_exact/<value>`` per value of this field (e.g.
    extra_info.tier); null: only the totals."""
    template: Literal["auto", "chat", "plain", "raw"] = "auto"
    """Prompt rendering: auto is the tokenizer's chat template when it has one, else plain; raw
    is the messages' contents alone (base models)."""
    shuffle: bool = True
    """Visit the rows in a seeded random order, a new order each epoch."""
    epochs: Annotated[int, Field(ge=1)] = 1
    """Passes over the data when ``learner.max_steps`` is null."""


class DpoConfig(Section):
    """Direct preference optimisation (the dpo mode) against a frozen copy of the start model."""

    kind: Literal["sigmoid", "ipo"] = "sigmoid"
    """Loss: sigmoid (DPO) or ipo."""
    beta: Annotated[float, Field(gt=0)] = 0.1
    """β: strength of the implicit KL to the reference."""
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """Conservative DPO's label smoothing ε (sigmoid only)."""


class LoraConfig(Section):
    """LoRA adapters (built with ``peft``) on the policy: only they are trained, optimised,
    checkpointed, exported and pushed; the base weights stay frozen, shared by the engines, and
    serve as the KL reference (the policy with its adapters disabled)."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight."""
    rank: Annotated[int, Field(ge=1)] = 16
    """Rank r of each adapter (A: r × in, B: out × r)."""
    alpha: Annotated[float, Field(gt=0)] = 32.0
    """Scale α: the update is (α / r)·B·A."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the adapters' input while training (sft, dpo; rl needs 0: the old-log-prob
    pass and the engines sample without it)."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Names (last path component) of the linear modules that get adapters, or ``all-linear``
    (every linear layer but the LM head). A comma-separated string is accepted."""
    init: Literal["default", "gaussian"] = "default"
    """Initialisation: default (A Kaiming-uniform, B zero: the adapted policy starts as the
    base) or gaussian (A normal, B zero)."""
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.]+$")] = "policy"
    """Name the engines serve the adapter under, with its version: ``<name>-v<version>``."""
    merged_export: bool = False
    """Also write merged full weights (base + (α / r)·B·A) next to each adapter export."""

    @field_validator("target_modules", mode="before")
    @classmethod
    def _modules_from_text(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("target_modules")
    @classmethod
    def _check_modules(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("learner.lora.target_modules: name at least one module, or all-linear")
        if "all-linear" in value and len(value) > 1:
            raise ValueError(
                f"learner.lora.target_modules: all-linear stands alone (got {', '.join(value)})"
            )
        return value


class WandbConfig(Section):
    """The ``wandb`` tracker (``learner.trackers``)."""

    project: Annotated[str, Field(min_length=1)] = "dynamo-rl"
    """Weights & Biases project of the run."""
    entity: str | None = None
    """Team or user (None: wandb's default)."""
    mode: Literal["offline", "online"] = "offline"
    """``offline`` writes the run to ``<run.dir>/wandb`` with no network (``wandb sync`` uploads it
    later); ``online`` streams to the server (needs ``WANDB_API_KEY``)."""


class LearnerConfig(Section):
    mode: Literal["rl", "sft", "dpo"] = "rl"
    """What to train: rl (the trajectory stream), sft (supervised on learner.data) or dpo
    (preference pairs in learner.data against a frozen reference)."""
    model: str | None = None
    """Hugging Face model directory (weights, config, tokenizer) to start from."""
    lr: Annotated[float, Field(gt=0)] = 1e-6
    """AdamW learning rate (the DynaMO recipe's 1e-6)."""
    max_steps: Annotated[int, Field(ge=1)] | None = None
    """Stop after this many train steps (counting resumed ones); null: run until stopped."""
    train_batch_size: Annotated[int, Field(ge=1)] = 32
    """Prompt groups per train step (sft: rows; dpo: preference pairs)."""
    mini_batch_size: Annotated[int, Field(ge=1)] | None = None
    """Prompt groups per optimizer update; null: the whole batch (one update per epoch)."""
    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    """Passes over each batch."""
    micro_batch_size: Annotated[int, Field(ge=1)] = 8
    """Responses per forward/backward on one rank (gradients accumulate over micro-batches)."""
    max_seq_len: Annotated[int, Field(ge=2)] = 4096
    """Longest prompt+response accepted; longer groups go to the dead-letter stream."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto is bf16 mixed precision on CUDA with bf16 support, else float32."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    critic: CriticConfig = CriticConfig()
    optim: OptimConfig = OptimConfig()
    stream: StreamConfig = StreamConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    push: PushConfig = PushConfig()
    data: DataConfig = DataConfig()
    dpo: DpoConfig = DpoConfig()
    lora: LoraConfig = LoraConfig()
    equal_reward_warn_steps: Annotated[int, Field(ge=0)] = 5
    """rl: warn (log, ``dynamo_learner_equal_reward_steps_total``, ``equal_reward_streak`` in the
    step log) when this many steps in a row trained on rewards that were all equal (all 0 or all
    1: no learning signal, often an unscorable answer format); 0: off."""
    metrics_port: Port | None = 9103
    """Prometheus /metrics port on rank 0 (0: a free port; null: off)."""
    metrics_host: Host = "127.0.0.1"
    """Address /metrics binds (0.0.0.0 in containers, so Prometheus can scrape it)."""
    trackers: list[Literal["tensorboard", "wandb"]] = []
    """Experiment trackers fed every step record and ``up``'s held-out evaluations, with the
    run config (``tensorboard``: event files in ``<run.dir>/tensorboard``; ``wandb``: a run in
    ``<run.dir>/wandb``, offline unless ``learner.wandb.mode`` says otherwise). Each needs its
    package (``pip install dynamo-rl[trackers]``). A comma-separated string is accepted."""
    wandb: WandbConfig = WandbConfig()

    @field_validator("trackers", mode="before")
    @classmethod
    def _trackers_from_text(cls, value: object) -> object:
        if isinstance(value, str):  # `up --trackers wandb,tensorboard`
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> LearnerConfig:
        if self.mode != "rl" and self.data.path is None:
            raise ValueError(
                f"learner.data.path: required in learner.mode {self.mode!r} (a JSONL or parquet "
                "file), e.g. learner.data.path=train.parquet"
            )
        if self.data.filter_key is not None and not self.data.filter_values:
            raise ValueError("learner.data.filter_key needs learner.data.filter_values (a list)")
        algo = self.algorithm
        adv = algo.advantage.type
        if adv == "gae" and not self.critic.enabled:
            raise ValueError(
                "learner.algorithm.advantage.type 'gae' (PPO with a critic) needs "
                "learner.critic.enabled: true"
            )
        if self.critic.enabled and adv != "gae":
            raise ValueError(
                f"learner.critic.enabled is only used by advantage type 'gae', not {adv!r}"
            )
        if algo.kl.in_reward_coef > 0 and adv != "gae":
            raise ValueError(
                "learner.algorithm.kl.in_reward_coef (KL in the reward) needs advantage type "
                f"'gae' (token rewards), not {adv!r}; use kl.coef for a KL loss term"
            )
        if algo.kl.target is not None and algo.kl.in_reward_coef == 0:
            raise ValueError("learner.algorithm.kl.target (adaptive β) needs kl.in_reward_coef > 0")
        if algo.policy_loss.type == "gspo" and algo.policy_loss.dual_clip is not None:
            raise ValueError(
                "learner.algorithm.policy_loss.dual_clip is not available with type 'gspo' "
                "(the sequence-level ratio has no dual-clip); use type 'ppo' or drop dual_clip"
            )
        if algo.policy_loss.type == "gspo" and algo.agg != "seq-mean-token-mean":
            raise ValueError(
                "learner.algorithm.policy_loss.type 'gspo' aggregates seq-mean-token-mean; "
                f"set learner.algorithm.agg to that (got {algo.agg!r})"
            )
        if algo.policy_loss.type == "gspo" and algo.modulation.enabled:
            raise ValueError(
                "learner.algorithm.modulation (DynaMO, token-level) does not apply to the "
                "sequence-level gspo loss; use policy_loss.type 'ppo'"
            )
        if algo.dapo.overlong_buffer > 0 and algo.dapo.max_response_len is None:
            raise ValueError(
                "learner.algorithm.dapo.overlong_buffer needs dapo.max_response_len (the engine's "
                "max_tokens)"
            )
        mini = self.mini_batch_size
        if mini is not None and mini > self.train_batch_size:
            raise ValueError(
                f"learner.mini_batch_size ({mini}) must be <= learner.train_batch_size "
                f"({self.train_batch_size})"
            )
        if self.data.stop_exact is not None and (self.mode == "dpo" or not self.data.eval_path):
            raise ValueError(
                "learner.data.stop_exact applies to learner.mode 'sft' with "
                f"learner.data.eval_path set (the rows whose exact match it reads); got mode "
                f"{self.mode!r}, eval_path {self.data.eval_path!r}"
            )
        if self.lora.enabled and self.mode == "rl" and self.lora.dropout > 0:
            raise ValueError(
                f"learner.lora.dropout must be 0 in learner.mode 'rl' (got {self.lora.dropout}): "
                "the old-log-prob pass and the engines sample without dropout; it applies to "
                "the sft and dpo modes"
            )
        cosine = self.optim.schedule == "cosine"
        if cosine and self.optim.total_steps is None and self.max_steps is None:
            raise ValueError(
                "learner.optim.schedule 'cosine' needs learner.optim.total_steps or "
                "learner.max_steps"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        """A reference policy is needed only when some KL term uses it (with LoRA it is the
        policy with its adapters disabled, no second copy)."""
        return self.algorithm.kl.coef > 0 or self.algorithm.kl.in_reward_coef > 0
