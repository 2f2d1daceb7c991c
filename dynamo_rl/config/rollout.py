"""The rollout worker's section: the dataset, the batch, sampling, the engine protocol, and the
bounds that keep the worker from running ahead of the learner. How many responses each prompt gets
is the allocator section's (:class:`dynamo_rl.contracts.allocator.AllocationParams`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port
from dynamo_rl.contracts.sampling import SamplingParams

Seconds = Annotated[float, Field(gt=0)]


class VerifiersEnvConfig(Section):
    """An environment of PyPI ``verifiers`` (its classic API, ``load_environment(**args)``)
    played inside the rollout worker (``rollout.env.name: verifiers``; ``docs/agents.md``)."""

    module: Annotated[str, Field(min_length=1)]
    """An installed environment module (``import`` name), or the path of a ``.py`` file, that
    defines ``load_environment``."""
    args: dict[str, Any] = {}
    """Keyword arguments of ``load_environment``."""


class EnvConfig(Section):
    """The environment of each episode (``docs/agents.md``). ``single_turn``, the default, is
    one prompt -> one response; the others run multi-turn episodes. The name, tool parser and
    tools are checked against the registries where environments are built
    (``dynamo_rl.envs.check_env_config``)."""

    name: str = "single_turn"
    """Registered environment: single_turn, guess_number, code_interpreter, tools, or one that
    ``import_module`` registers; or ``verifiers``: a ``verifiers`` environment (``verifiers``
    below), played by the rollout worker only."""
    import_module: str | None = None
    """A Python module imported before ``name`` is looked up (registers your environments)."""
    max_turns: Annotated[int, Field(ge=1)] = 4
    """Most model turns per episode; the episode ends after this many."""
    max_tool_calls: Annotated[int, Field(ge=0)] = 8
    """Most tool calls per episode; the episode ends at the turn that reaches it (its
    observation is not appended)."""
    max_episode_tokens: Annotated[int, Field(ge=2)] | None = None
    """Per-episode budget of prompt + response tokens (observations included); each turn may
    generate at most what is left, and an observation that does not fit ends the episode (None:
    the model's context, ``rollout.max_prompt_len`` + ``sampling.max_tokens`` as resolved when the
    data loads, so a single-turn response is never cut by it; no budget when neither is known)."""
    tool_timeout_s: Seconds = 10.0
    """Deadline of one environment step (its tool calls); past it the model sees a timeout
    error and the episode goes on. Also the sandbox's run timeout."""
    observation_max_chars: Annotated[int, Field(ge=16)] = 1024
    """Tool output kept per call (head and tail, the cut named)."""
    tool_parser: str = "hermes"
    """Tool-call parser of the tools environment (dynamo_rl.envs.TOOL_PARSERS)."""
    tools: list[dict[str, Any]] = []
    """OpenAI-style function schemas ``{"type": "function", "function": {"name", "description",
    "parameters"}}`` of the tools environment; each name must be in dynamo_rl.envs.TOOL_FUNCTIONS
    (built in: calculator, python)."""
    system_prompt: str | None = None
    """System message of code_interpreter/tools (None: the environment's own)."""
    stateful_cells: bool = False
    """code_interpreter: re-run earlier cells silently before each new one (state across
    cells)."""
    sandbox_url: str | None = None
    """SandboxFusion-compatible /run_code server (None: endpoints.reward_url)."""
    sandbox_max_wait_s: Annotated[float, Field(ge=0)] = 30.0
    """How long an unreachable sandbox is retried before the episode is dropped (counted)."""
    turn_rewards: bool = False
    """Add the environment's per-turn rewards to the outcome reward, placed on each turn's last
    model token (false: outcome reward only)."""
    turn_reward_discount: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount of per-turn rewards: turn k of K counts discount^(K-1-k) in the response's
    reward."""
    malformed_penalty: Annotated[float, Field(ge=0)] = 0.0
    """Subtracted from the reward once per malformed tool call."""
    tool_call_cost: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
    """Subtracted from the reward the learner trains on once per tool call (malformed ones
    included), in 0..1; never from the outcome's ``correct`` (the evaluation's accuracy, the
    allocator's successes)."""
    guess_low: int = 1
    """guess_number: smallest secret."""
    guess_high: int = 100
    """guess_number: largest secret."""
    verifiers: VerifiersEnvConfig | None = None
    """name verifiers: the environment module and its ``load_environment`` arguments; its
    dataset gives the prompts (``rollout.dataset`` stays unset) and its rubric the rewards."""

    @model_validator(mode="after")
    def _shape(self) -> EnvConfig:
        """What needs no registry; the name, tool parser and tool implementations are checked
        where environments are built (``dynamo_rl.envs.check_env_config``)."""
        for i, t in enumerate(self.tools):
            fn = t.get("function") if isinstance(t, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if t.get("type") != "function" or not isinstance(name, str):
                raise ValueError(
                    f"rollout.env.tools[{i}] must be {{type: function, function: {{name: ...}}}}"
                )
        if self.name == "tools" and not self.tools:
            raise ValueError("rollout.env.name 'tools' needs rollout.env.tools (function schemas)")
        if (self.name == "verifiers") != (self.verifiers is not None):
            raise ValueError(
                "rollout.env.verifiers (module, args) goes with rollout.env.name 'verifiers' "
                f"and only with it (got name {self.name!r}, verifiers "
                f"{'set' if self.verifiers is not None else 'unset'})"
            )
        if self.guess_low > self.guess_high:
            raise ValueError(
                f"rollout.env.guess_low ({self.guess_low}) must be <= guess_high ({self.guess_high})"
            )
        return self


class TeacherConfig(Section):
    """On-policy distillation's teacher (``docs/learner.md``): after sampling, every response's
    tokens are scored under a teacher model and its log-probs travel on the stream beside the
    sampling log-probs (``learner.algorithm.opd`` trains on them). The teacher's engines answer
    ``/v1/completions`` with vLLM's ``prompt_logprobs`` (vLLM, the embedded engine)."""

    engine_urls: Annotated[list[str], Field(min_length=1)]
    """Base URLs of the engines serving the teacher model, used in turn."""
    tokenizer: Annotated[str, Field(min_length=1)]
    """The teacher model's tokenizer directory: the worker refuses to start unless it equals the
    student's (``rollout.tokenizer``, else ``engine.model``), token for token."""
    model_name: str | None = None
    """The 'model' field of the scoring requests (None: the first id of GET /v1/models)."""
    request_timeout_s: Seconds = 120.0
    """Deadline of one scoring request."""
    max_wait_s: Annotated[float, Field(ge=0)] = 0.0
    """How long an unreachable teacher is retried (with ``rollout.backoff_s`` .. ``backoff_max_s``)
    before the batch fails (0: forever); nothing is pushed unscored either way."""
    max_concurrency: Annotated[int, Field(ge=1)] = 32
    """Most scoring requests in flight at once."""


class RolloutConfig(Section):
    metrics_port: Port = 9102
    """Prometheus /metrics port (0: a free port)."""
    metrics_host: Host = "127.0.0.1"
    """Address /metrics binds (0.0.0.0 in containers, so Prometheus can scrape it)."""
    sample_log_mb: Annotated[float, Field(ge=0)] = 32.0
    """Size bound of the worker's sample log (``<run.dir>/samples/<worker_id>.jsonl``, one line
    per group pushed: prompt, responses, rewards, allocated n, priority); past it the file becomes
    ``<worker_id>.jsonl.1`` (replacing the older one) and a new one starts. 0: no sample log."""
    namespace: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")] | None = None
    """Allocator namespace and stream scope (None: run.name)."""
    worker_id: Annotated[str, Field(min_length=1)] | None = None
    """Name of this worker in the trajectory groups it writes (None: hostname-pid)."""

    # Dataset.
    dataset: str | None = None
    """Prompt file: JSONL (one object per line) or parquet in the verl layout."""
    dataset_format: Literal["auto", "jsonl", "parquet"] = "auto"
    """File format (auto: from the extension, .jsonl/.json or .parquet)."""
    tokenizer: str | None = None
    """Hugging Face tokenizer directory (None: engine.model)."""
    prompt_template: Literal["auto", "chat", "plain", "raw"] = "auto"
    """How chat messages become text: the tokenizer's chat template (chat), 'Role: content' lines
    ending in 'Assistant:' (plain), chat when the tokenizer has a template, else plain (auto), or
    the messages' contents alone, for base models (raw)."""
    default_kind: Literal["math", "code"] = "math"
    """Reward kind for rows that do not name one (a row's 'kind' or extra_info.kind wins)."""
    max_prompt_len: Annotated[int, Field(ge=1)] | None = None
    """Longest prompt in tokens (after rendering) sent to the engines; longer ones are handled by
    ``prompt_len_policy`` when the data loads (None: the model's context, ``max_position_embeddings``
    in the tokenizer directory's config.json, minus ``sampling.max_tokens``; no limit when the
    config does not tell)."""
    prompt_len_policy: Literal["drop", "truncate_left", "truncate_right", "error"] = "drop"
    """What to do with a prompt longer than ``max_prompt_len``: leave it out (drop), keep its last
    (truncate_left) or first (truncate_right) ``max_prompt_len`` tokens, or refuse the dataset
    (error)."""
    max_prompts: Annotated[int, Field(ge=1)] | None = None
    """Train on the dataset's first ``max_prompts`` rows only (None: all of them): a pool small
    enough that the run revisits its prompts, so the allocator has their statistics early (the
    quickstart's 384 of 3,000 rows, each seen about ten times; the warm start still uses every
    row). The cut comes before sharding and the length check."""
    shuffle: bool = True
    """Shuffle the prompts each epoch (seeded by run.seed and the epoch)."""
    num_workers: Annotated[int, Field(ge=1)] = 1
    """Workers sharing the dataset; each takes every num_workers-th prompt."""
    worker_index: Annotated[int, Field(ge=0)] = 0
    """This worker's shard, 0 .. num_workers-1."""

    # Responses per prompt: the budget and bounds are the allocator section's
    # (allocator.n_per_prompt, n_min, n_max; rollout.n, rollout.n_min, rollout.n_max load there).
    batch_size: Annotated[int, Field(ge=1)] = 8
    """Prompts per batch (one Allocate call, one trajectory group each)."""
    allocation: Literal["dynamic", "uniform"] = "uniform"
    """dynamic: counts from the allocator (DRA) within allocator.n_min..n_max,
    allocator.n_per_prompt on average (needs learner.algorithm.agg prompt-mean, or
    allocator.allow_token_mean); uniform: allocator.n_per_prompt per prompt, the allocator is only
    told the outcomes. Uniform by default, as the learner's defaults are GRPO's (token-mean, no
    modulation); DynaMO's recipes set dynamic with prompt-mean."""
    round_size: Annotated[int, Field(ge=0)] = 0
    """Sampling in rounds (Reinforce-Ada): 0, off: a prompt's count is generated at once. k > 0:
    its episodes are generated k at a time, each round verified before the next, and the prompt
    stops as soon as its group has both a correct and an incorrect episode, or at its count (the
    allocator's, or allocator.n_per_prompt under uniform allocation). Single-turn environments
    only."""
    max_n_per_request: Annotated[int, Field(ge=1)] = 8
    """A prompt's count is split into engine requests of at most this many samples, so one
    prompt's responses spread across replicas."""
    num_batches: Annotated[int, Field(ge=0)] = 0
    """Batches to produce before exiting (0: run until stopped)."""
    drop_uniform_groups: bool = False
    """The informative-batch filler (DAPO's dynamic sampling on the rollout side): a group whose
    episodes all scored the same (no learning signal; ``dynamo_rl.contracts.generation``) is
    counted and dropped before the stream, its outcomes still reported to the allocator, and the
    worker goes on generating, so the learner's ``train_batch_size`` groups all carry a signal.
    What the dropped groups cost rides on the next pushed entry, for the learner's ``gen_*``
    step-record fields. Needs a group-relative advantage (grpo, drgrpo, rloo) and
    ``allocator.n_per_prompt`` >= 2."""

    # Engines.
    engine_api: Literal["openai", "sglang"] = "openai"
    """Generation protocol: OpenAI /v1/completions (embedded engine, vLLM, SGLang) or SGLang's
    native /generate."""
    weight_api: Literal["sglang", "vllm"] = "sglang"
    """Engine-control protocol (dynamo_rl.contracts.weight_control) of every engine in the run: SGLang's
    weight-update routes (embedded engine, SGLang) or vLLM's weight-transfer API (also served by
    the embedded engine). The rollout worker reads versions with it and the learner pushes with
    it; vLLM needs VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config, and has no
    load-from-disk route (learner.push.transport=distributed)."""
    update_mode: Literal["wait", "interrupt"] = "wait"
    """How a weight push meets the generations in flight (docs/rollout.md, "Weight updates and
    long generations"). wait: it waits for them, so a response comes from one version.
    interrupt: they stop at a token boundary, the weights change, and they go on under the new
    ones; every token carries the version that sampled it (the embedded engine applies the
    update between two tokens and rebuilds its cache; vLLM is paused with abort and the rollout
    client continues each cut response from its tokens so far), and the learner's staleness
    bound applies to a group's oldest token."""
    vllm_pause_mode: Literal["keep", "wait", "abort"] = "wait"
    """weight_api=vllm, update_mode=wait: how the learner pauses an engine for a push (POST
    /pause?mode=...). wait lets running requests finish, so no response spans an update; keep
    freezes them and resumes them on the new weights (vLLM reports no version per token, so the
    response keeps the version read before it); abort cuts them (finish_reason "abort", which
    the rollout client retries). update_mode=interrupt pauses with abort and continues the cut
    responses, whatever this says (keep is refused with it)."""
    model_name: str | None = None
    """The 'model' field of OpenAI requests (None: the first id of GET /v1/models)."""
    discover_engines: bool = False
    """Also use the engines registered in Redis (engines_key(run.name), written by each embedded
    engine on start), checked before every batch; endpoints.engine_urls stay in the pool."""
    request_timeout_s: Seconds = 600.0
    """Deadline of one generation request."""
    engine_max_wait_s: Annotated[float, Field(ge=0)] = 0.0
    """How long to wait when every engine replica is down before failing (0: forever)."""

    # Reward service.
    reward_timeout_s: Seconds = 120.0
    """Deadline of one /v1/verify request."""
    reward_batch_items: Annotated[int, Field(ge=1)] = 256
    """Most items per /v1/verify request (keep it <= the reward service's reward.code.max_pending
    for code datasets: a larger request is refused whole)."""
    reward_max_wait_s: Annotated[float, Field(ge=0)] = 0.0
    """How long to keep retrying an unreachable reward service before failing (0: forever);
    nothing is pushed unscored either way."""

    # Allocator.
    allocator_timeout_s: Seconds = 5.0
    """Deadline of one allocator call; past its retries the worker falls back to uniform n."""

    # Bounds.
    max_staleness: Annotated[int, Field(ge=0)] = 1
    """Start a batch only when the engines' weights are at most this many versions behind the
    learner's latest (0: on-policy); otherwise wait for the push."""
    max_pending_groups: Annotated[int, Field(ge=0)] = 256
    """Pause while the stream holds at least this many groups the learner has not read yet
    (0: no bound)."""
    lease_ttl_s: Seconds = 60.0
    """A worker's lease on the prompts of its batch (``lease_key``) lasts this long and is renewed
    every third of it while the batch runs; once it lapses (the worker died) another worker — or
    the same worker id restarted, at once — re-issues those prompts."""
    poll_interval_s: Seconds = 0.5
    """How often a waiting worker checks again (staleness, backpressure)."""
    backoff_s: Seconds = 0.5
    """First retry delay after a failure (engines, reward service, Redis); doubles per retry."""
    backoff_max_s: Seconds = 10.0
    """Longest retry delay."""

    sampling: SamplingParams = SamplingParams()
    """Sampling parameters sent to the engines with every generation request (the one
    declaration of the sampling settings, ``dynamo_rl.contracts.sampling``)."""
    env: EnvConfig = EnvConfig()
    """The episodes' environment and limits (default single_turn: one prompt, one response)."""
    teacher: TeacherConfig | None = None
    """On-policy distillation: the teacher that scores every sampled token (None: none)."""

    @model_validator(mode="after")
    def _bounds(self) -> RolloutConfig:
        if self.worker_index >= self.num_workers:
            raise ValueError(
                f"rollout.worker_index ({self.worker_index}) must be < rollout.num_workers "
                f"({self.num_workers})"
            )
        if self.update_mode == "interrupt" and self.vllm_pause_mode == "keep":
            raise ValueError(
                "rollout.vllm_pause_mode: 'keep' does not go with rollout.update_mode "
                "'interrupt', which pauses vLLM with 'abort' and continues the cut responses "
                "(leave vllm_pause_mode at wait or abort, or use update_mode 'wait')"
            )
        if self.round_size and self.env.name != "single_turn":
            raise ValueError(
                f"rollout.round_size ({self.round_size}) needs rollout.env.name single_turn "
                f"(got {self.env.name!r}): sampling in rounds is built and tested for "
                "single-turn episodes only (set rollout.round_size: 0 for multi-turn ones)"
            )
        if self.env.name == "verifiers" and self.dataset is not None:
            raise ValueError(
                f"rollout.dataset ({self.dataset!r}) must be unset with rollout.env.name "
                "'verifiers': the prompts are the environment's own dataset's rows"
            )
        if self.env.name == "verifiers" and self.prompt_len_policy.startswith("truncate"):
            raise ValueError(
                f"rollout.prompt_len_policy must be 'drop' or 'error' with rollout.env.name "
                f"'verifiers' (got {self.prompt_len_policy!r}): the environment sends its own "
                "messages, which the worker cannot truncate"
            )
        if self.backoff_s > self.backoff_max_s:
            raise ValueError(
                f"rollout.backoff_s ({self.backoff_s}) must be <= rollout.backoff_max_s "
                f"({self.backoff_max_s})"
            )
        return self

    @property
    def push_pause_mode(self) -> Literal["keep", "wait", "abort"]:
        """The ``/pause?mode=`` of a vLLM-shaped push: abort when responses continue across
        updates (``update_mode: interrupt``), else ``vllm_pause_mode``."""
        return "abort" if self.update_mode == "interrupt" else self.vllm_pause_mode
