"""``dynamo-rl up``'s section: what it starts locally and the recipe around training."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from dynamo_rl.config.base import Section

Count = Annotated[int, Field(ge=1, le=64)]


class TinyModelConfig(Section):
    """The model ``up`` builds when neither ``engine.model`` nor ``learner.model`` is set."""

    hidden_size: Annotated[int, Field(ge=8)] = 128
    """Width of the Qwen2 model."""
    num_layers: Annotated[int, Field(ge=1)] = 2
    """Transformer blocks."""
    num_heads: Annotated[int, Field(ge=1)] = 4
    """Attention heads (must divide hidden_size)."""
    num_kv_heads: Annotated[int, Field(ge=1)] = 2
    """Key/value heads (must divide num_heads)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        # Checked here so that ``up`` refuses the config before it starts anything.
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"up.tiny_model.num_heads ({self.num_heads}) must divide "
                f"up.tiny_model.hidden_size ({self.hidden_size})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"up.tiny_model.num_kv_heads ({self.num_kv_heads}) must divide "
                f"up.tiny_model.num_heads ({self.num_heads})"
            )
        return self


class WarmStartConfig(Section):
    """Supervised warm start on the task's reference answers before RL (the learner's sft mode)."""

    steps: Annotated[int, Field(ge=0)] = 500
    """Optimizer steps (0: no warm start; RL starts from the model as it is)."""
    lr: Annotated[float, Field(gt=0)] = 1e-3
    """Learning rate (after the sft mode's short warmup)."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    """AdamW weight decay of the warm start."""
    batch_size: Annotated[int, Field(ge=1)] = 64
    """Examples per step."""
    grad_clip: Annotated[float, Field(gt=0)] | None = 1.0
    """Gradient-norm clipping of the warm start (None: off)."""
    tiers: list[str] = ["easy", "medium", "medium-rev", "medium-sub", "hard"]
    """Task tiers the warm start sees (the rest are left for RL to find, or not). With ``hard``
    (two two-digit numbers) the short warm start leaves many of those half-solved: what RL learns
    most from; without it they stay at 0% and RL has nothing to go on there."""
    check_rows: Annotated[int, Field(ge=0)] = 0
    """Built-in task: train rows per tier held out of the warm start to check it (greedy exact
    match per tier, ``eval_exact/<tier>`` of the sft run); 0: no check (the quickstart: 32). On
    ``products``: that many train questions after the warm start's ``rows`` (their
    demonstrations, when ``demos: tool_calls``)."""
    target_exact: Annotated[float, Field(ge=0, le=1)] | None = None
    """With ``check_rows``: the warm start stops at the first check (every ``check_every``
    steps) whose greedy exact match over all checked rows reaches this, so ``steps`` is the most
    it runs; null: it runs ``steps``. A fixed step count leaves seeds anywhere from barely
    started to well learned; a target stops each at the same skill."""
    check_every: Annotated[int, Field(ge=1)] = 50
    """Steps between checks while ``target_exact`` is set."""
    min_tier_accuracy: Annotated[float, Field(ge=0, le=1)] = 0.1
    """A tier whose checked greedy accuracy is below this is not learned: the warm start goes on
    for ``extend_steps`` more steps with half of each batch from the tiers not learned."""
    extend_steps: Annotated[int, Field(ge=1)] = 100
    """Steps of each extension."""
    max_extensions: Annotated[int, Field(ge=0)] = 3
    """Extensions before ``up`` gives up with an error naming the tiers still not learned."""
    demos: Literal["answers", "tool_calls", "half_tool_calls"] = "answers"
    """``products`` and ``when`` tasks: what the warm start imitates: the direct answers
    (``answers``), or episodes of the ``rollout.env`` environment (``tools`` with the calculator,
    or ``code_interpreter``) that call the tool and copy its output (``tool_calls``; needs
    ``rollout.prompt_template: raw``), or ``half_tool_calls``: the tool on a random half of the
    questions whatever their tier (seeded by ``run.seed``), direct answers on the others."""
    rows: Annotated[int, Field(ge=0)] = 0
    """``products`` and ``when`` tasks: train questions the warm start sees (the first ones; 0:
    all)."""

    @model_validator(mode="after")
    def _target_needs_check(self) -> WarmStartConfig:
        if self.target_exact is not None and not self.check_rows:
            raise ValueError(
                "up.warm_start.target_exact needs up.warm_start.check_rows > 0 (the held-out "
                "rows it is checked on)"
            )
        return self


class EvalConfig(Section):
    """Held-out accuracy before and after RL, through the engines and the reward service."""

    prompts: Annotated[int, Field(ge=0)] = 300
    """Held-out prompts evaluated (0: skip the evaluations)."""
    samples: Annotated[int, Field(ge=1)] = 4
    """Samples per prompt: accuracy is avg@samples (pass@1 estimated over the samples)."""
    temperature: Annotated[float, Field(ge=0)] = 1.0
    """Sampling temperature of the evaluation (the policy's own, as RL trains it)."""


class UpTeacherConfig(Section):
    """On-policy distillation's teacher, served by ``up`` (``docs/learner.md``): ``engines``
    engines of ``engine.kind`` load ``model`` on free ports, are supervised like the student's, and
    ``rollout.teacher`` is filled in with their URLs and ``model`` as the tokenizer to compare.
    They receive no weight pushes."""

    model: Annotated[str, Field(min_length=1)]
    """The teacher's Hugging Face folder (e.g. an earlier run's ``export/final``); its tokenizer
    must equal the student's."""
    engines: Count = 1
    """Teacher engine replicas."""


class RestartConfig(Section):
    """How ``up`` restarts a crashed service (like a compose ``restart: always`` policy); the
    delays are :class:`dynamo_rl.retry.Backoff`'s with ``base_s=backoff_s``,
    ``cap_s=backoff_max_s`` and this ``jitter``."""

    enabled: bool = True
    """Restart services that exit while the run goes on (false: the first exit stops the run)."""
    backoff_s: Annotated[float, Field(ge=0)] = 1.0
    """Delay before the first restart of a service; doubled for each further restart in the window."""
    backoff_max_s: Annotated[float, Field(ge=0)] = 30.0
    """Longest delay between restarts."""
    max_restarts: Annotated[int, Field(ge=0)] = 5
    """A service that needs more restarts than this within ``window_s`` stops the run."""
    window_s: Annotated[float, Field(gt=0)] = 300.0
    """The crash-loop window."""
    jitter: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Each delay is scaled by a random factor in ``[1 - jitter, 1]`` (0: exact doubling; one
    ``up`` restarts few services, so lock-step retries are not a concern by default)."""


class UpConfig(Section):
    engines: Count = 1
    """Embedded inference engine replicas."""
    rollout_workers: Count = 1
    """Rollout worker processes (they shard the dataset)."""
    learner_procs: Count = 1
    """Learner ranks under torchrun (FSDP2)."""
    task: Literal["arith", "products", "when", "longtail"] = "arith"
    """Built-in task generated into the run folder when ``rollout.dataset`` is unset: ``arith``
    (the quickstart's tiers), ``products`` (multi-digit products, the agent recipe's), ``when``
    (easy sums and hard products mixed, the when-to-call recipe's; ``tasks.when``) or ``longtail``
    (short sums and long worked ones, responses over ten times longer: the update-mode
    benchmark's; warm start it with ``up.warm_start.tiers: [short, long]``)."""
    task_tiers: list[Literal["easy", "hard", "two_calls"]] = ["easy", "hard"]
    """``when`` task: its tiers, in equal shares (``easy``: 4-digit + 3-digit sums without carries; ``hard``:
    4-digit x 3-digit products; ``two_calls``: ``(a*b)+(c*d)``, demonstrated with two calls)."""
    task_train: Annotated[int, Field(ge=1)] = 3000
    """Train prompts of the generated task."""
    task_test: Annotated[int, Field(ge=1)] = 1000
    """Held-out prompts of the generated task."""
    tiny_model: TinyModelConfig = TinyModelConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    eval: EvalConfig = EvalConfig()
    health_timeout_s: Annotated[float, Field(gt=0)] = 180.0
    """How long each service may take to answer its health check."""
    restart: RestartConfig = RestartConfig()
    teacher: UpTeacherConfig | None = None
    """A teacher for on-policy distillation, started beside the engines (None: none; a
    ``rollout.teacher`` given in the config is then used as it is)."""
    sft_control: bool = False
    """The SFT-continuation control instead of RL: after the evaluation before, ``up`` goes on
    with supervised training on the warm start's own demonstrations for the same compute as the
    RL run — ``learner.max_steps`` steps of ``learner.train_batch_size`` x ``allocator.n_per_prompt`` rows each
    (RL's optimizer steps and sequences per step), at ``up.warm_start.lr`` — loads the result into
    the engines and evaluates after as RL would (``products`` and ``when`` tasks)."""

    @model_validator(mode="after")
    def _tiers_once(self) -> UpConfig:
        if not self.task_tiers or len(set(self.task_tiers)) != len(self.task_tiers):
            raise ValueError(
                f"up.task_tiers: each of easy, hard, two_calls at most once and at least one, "
                f"got {self.task_tiers}"
            )
        return self
