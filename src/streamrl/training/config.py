"""The one configuration system: typed, validated pydantic models, loaded from YAML plus dotted
command-line overrides (``train.steps=20 algo.dual_clip=3``).

Every algorithm has its own section class (``training/algo_config.py``, with the algorithm table);
the ``algo.name`` field selects it. Unknown fields are errors, and every error names its field and,
for a choice, the allowed values, before any work starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SerializeAsAny,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from streamrl.policy.protocols import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MAX_TOKENS_CAP
from streamrl.training.algo_config import ALGORITHM_TABLE, GroupConfig, PolicyLossConfig, algo_section
from streamrl.training.algo_config import ALGORITHMS as ALGORITHMS  # re-exported: the CLI's choices
from streamrl.training.sections import MAX_LR, Float, Section

MAX_TASKS = 1_000_000
#: the configurations shipped as package data (``configs/`` in the repository links here)
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """A configuration problem, reported as one line per bad field."""


class LoraConfig(Section):
    r: StrictInt = Field(16, ge=1)
    alpha: StrictInt = Field(32, ge=1)
    dropout: Float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelConfig(Section):
    #: "tiny", "smollm2-135m", or a local Hugging Face model folder
    spec: str = "tiny"
    #: every name the loader accepts (policy.loading.DTYPE_NAMES)
    #: ("auto": bfloat16 only where the hardware executes it natively, float32 otherwise)
    dtype: Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"] = "auto"
    device: str = "cpu"
    #: torch threads of the learner (null: half the cores; SFT alone uses all of them)
    threads: StrictInt | None = Field(None, ge=1)
    lora: LoraConfig | None = None
    #: config overrides for built-in specs, e.g. {hidden_size: 128, num_hidden_layers: 2}
    overrides: dict[str, Any] = {}
    #: start from these weights (an SFT output or checkpoint model folder) instead of the spec's
    init_from: str | None = None
    #: train only the top N transformer blocks (their LoRA adapters, or their weights): the backward
    #: pass stops at the lowest trained block, about a third less learner time with half of them;
    #: null trains every block
    train_top_layers: StrictInt | None = Field(None, ge=1)
    #: recompute activations in the backward pass (policy and PPO's critic): far less training
    #: memory for about one more forward pass of learner time
    gradient_checkpointing: StrictBool = False
    #: the run's memory budget in GiB (null: the RAM available at start): the engine's kept KV is
    #: sized within it, and a run whose estimates exceed it is refused before it starts
    memory_gb: Float | None = Field(None, gt=0.0)
    #: the generation engine: "hf" (transformers, CPU or GPU) or "vllm" (GPU; the ``vllm`` extra)
    engine: Literal["hf", "vllm"] = "hf"
    #: the engine's copy of the weights: "same" as the policy, "bfloat16", or "int8" (every projection
    #: through an int8 copy, made again at each published version; hf engine, Llama-family models).
    #: The learner keeps its weights and importance-corrects the mismatch (docs/results/speed.md)
    rollout_dtype: Literal["same", "bfloat16", "int8"] = "same"
    #: how the model writes tool calls (env.tools): "auto" reads it off the chat template (and says
    #: what it picked), or one of streamrl.policy.tool_format.FORMATS (hermes, qwen3, llama3_json)
    tool_format: str = "auto"
    #: replace the tokenizer's chat template: a shipped one by name ("hermes": ChatML with Hermes tool
    #: calls) or a .jinja file; null keeps the model's own (the tiny and SmolLM2 ones render tools)
    chat_template: str | None = None
    #: tiny only: add the environment's entity tokens (``EnvSpec.entity_tokens``; webshop_lite: every
    #: ASIN) to the tokenizer as whole tokens, so copying one from the page is a one-token copy.
    #: A model from ``init_from`` keeps the tokenizer it was saved with
    entity_tokens: StrictBool = False

    @field_validator("entity_tokens")
    @classmethod
    def _entity_tokens_need_tiny(cls, value: bool, info: ValidationInfo) -> bool:
        spec = str(info.data.get("spec", "tiny"))
        if value and spec.partition(":")[0] != "tiny":
            raise ValueError(f"applies to spec 'tiny' (its embeddings train from scratch), not {spec!r}")
        return value

    @field_validator("engine")
    @classmethod
    def _vllm_needs_cuda(cls, value: str, info: ValidationInfo) -> str:
        device = info.data.get("device", "cpu")
        if value == "vllm" and not device.startswith("cuda"):
            raise ValueError(f"'vllm' runs on a GPU: set model.device=cuda (model.device is {device!r})")
        return value

    @field_validator("rollout_dtype")
    @classmethod
    def _int8_on_the_hf_engine_on_cpu(cls, value: str, info: ValidationInfo) -> str:
        if value == "int8" and (info.data.get("engine") != "hf" or not str(info.data.get("device", "cpu")).startswith("cpu")):
            raise ValueError("int8 rollouts run on the hf engine on a CPU (torch's fbgemm int8 kernels)")
        return value


class EnvConfig(Section):
    name: str = "alfworld_lite"
    options: dict[str, Any] = {}
    #: the tool form: actions are the model's native tool calls (its chat template renders the
    #: environment's @tool schemas; results come back as tool messages). False: the text form
    tools: StrictBool = False
    #: options for the environment's prompt builder and action parser
    prompt: dict[str, Any] = {}
    parser: dict[str, Any] = {}
    #: the training prompt pool: the first N task ids of the train split (at most MAX_TASKS: the
    #: prompt source weighs the whole pool at every dispatch; memory is checked before the run too)
    train_tasks: StrictInt = Field(256, ge=1, le=MAX_TASKS)
    #: evaluation split (null: the environment's own default), or several joined by "+"
    #: ("seen+unseen"); how many tasks of each to use, and how many of each split's first ids to
    #: skip (the tasks settings were chosen on, so that a held-out claim rests on others)
    eval_split: str | None = None
    eval_tasks: StrictInt | None = Field(None, ge=1)
    eval_from: StrictInt = Field(0, ge=0)


class LatencyConfig(Section):
    """Injected waits that produce the asynchronous regime on one machine (``rollout/latency.py``;
    training episodes only, off by default)."""

    #: median wait after each turn and at each episode's end, seconds
    turn_s: Float = Field(0.0, ge=0.0)
    episode_s: Float = Field(0.0, ge=0.0)
    #: lognormal (``shape`` = sigma) or pareto (``shape`` = alpha, heavier when smaller)
    tail: Literal["lognormal", "pareto"] = "lognormal"
    shape: Float = Field(1.0, gt=0.0)
    #: an episode that is not won waits this many times as long at its end
    failure_factor: Float = Field(1.0, ge=0.0)


class RolloutConfig(Section):
    concurrency: StrictInt = Field(32, ge=1)
    layout: Literal["per_step", "full_history"] = "per_step"
    max_turns: StrictInt | None = Field(None, ge=1)
    max_new_tokens: StrictInt = Field(DEFAULT_MAX_NEW_TOKENS, ge=1)
    max_context_tokens: StrictInt = Field(2048, ge=16)
    temperature: Float = Field(1.0, gt=0.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    max_staleness: StrictInt = Field(4, ge=0)
    step_timeout_s: Float = Field(60.0, gt=0.0)
    #: torch threads of the generation engine (null: the cores the learner leaves)
    engine_threads: StrictInt | None = Field(None, ge=1)
    #: where episodes are played: "local" (this process) or "ray" (``workers`` Ray actors, each with
    #: its own engine and environments; connects to RAY_ADDRESS when set). See docs/scale_out.md
    backend: Literal["local", "ray"] = "local"
    #: Ray rollout workers (backend: ray only)
    workers: StrictInt = Field(1, ge=1)
    #: training stops (after a checkpoint) when this many episodes in a row end in an environment
    #: fault (env_error, env_timeout); null: train.batch_size
    max_env_faults_in_row: StrictInt | None = Field(None, ge=1)
    latency: LatencyConfig = LatencyConfig()

    @field_validator("workers")
    @classmethod
    def _workers_need_ray(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("backend") == "local" and value != 1:
            raise ValueError("applies to rollout.backend=ray only")
        return value

    @field_validator("max_context_tokens")
    @classmethod
    def _room_to_generate(cls, value: int, info: ValidationInfo) -> int:
        new = info.data.get("max_new_tokens")
        if new is not None and value <= new:
            raise ValueError(f"must exceed rollout.max_new_tokens ({new}): a prompt needs room too")
        return value


class RewardConfig(Section):
    scale: Float = Field(1.0, gt=0.0)
    #: subtracted from the outcome once per turn whose action format was invalid
    invalid_format_penalty: Float = Field(0.0, ge=0.0)
    #: subtracted once per well-formed action the environment could not carry out (alfworld's
    #: "Nothing happens."): denser credit for a policy that repeats impossible actions
    ineffective_penalty: Float = Field(0.0, ge=0.0)


class OptimConfig(Section):
    #: in (0, MAX_LR = 1.0]
    lr: Float = Field(1e-6, gt=0.0, le=MAX_LR)
    weight_decay: Float = Field(0.0, ge=0.0)
    betas: tuple[Float, Float] = (0.9, 0.999)
    #: AdamW's epsilon (the actor's and PPO's critic's)
    eps: Float = Field(1e-8, gt=0.0)
    grad_clip: Float = Field(1.0, gt=0.0)
    #: sequences per forward/backward; losses use global denominators across micro-batches
    micro_batch_size: StrictInt = Field(8, ge=1)


class TrainConfig(Section):
    steps: StrictInt = Field(50, ge=0)
    #: stop after the step that reaches this many minutes of RL (rollout and learning since the run
    #: began, the first and last evaluations excluded; a resumed run's clock goes on from its
    #: checkpoint), as if ``steps`` had been reached; null: no limit
    time_limit_minutes: Float | None = Field(None, gt=0.0)
    #: trajectories per learner step
    batch_size: StrictInt = Field(32, ge=1)
    #: torch and numpy take seeds below 2**63
    seed: StrictInt = Field(0, ge=0, le=2**63 - 1)
    eval_every: StrictInt = Field(0, ge=0)
    eval_at_start: StrictBool = True
    checkpoint_every: StrictInt = Field(10, ge=0)
    keep_checkpoints: StrictInt = Field(2, ge=1)
    #: learner micro-batch and reference-model switch
    reference_model: StrictBool = False
    #: processes the learner runs in, its transformer blocks sharded over them with FSDP2 and the
    #: micro-batches shared (training/data_parallel.py); 1: the training process alone
    learner_processes: StrictInt = Field(1, ge=1)
    #: a learner process whose heartbeat is older than this (stopped, hung) ends the run as a dead one does
    learner_heartbeat_s: Float = Field(180.0, gt=0.0)


class SFTConfig(Section):
    #: "expert" (the env's privileged expert_action), "search_expert" (its non-privileged searching_expert), or a JSONL file of demonstrations
    source: str = "search_expert"
    demos: StrictInt = Field(200, ge=0)
    epochs: StrictInt = Field(2, ge=1)
    lr: Float = Field(1e-3, gt=0.0, le=MAX_LR)
    batch_size: StrictInt = Field(16, ge=1)
    #: drop a demo when it fails (demonstrations should be successes)
    only_successes: StrictBool = True
    #: weight of the next-token loss on prompt tokens (the pages the demonstrator read) next to the
    #: action loss; 0 trains on actions only (TRL's completion-only default). A from-scratch model
    #: learns to read and copy from the page far sooner with a small weight (docs/webshop.md).
    prompt_loss_weight: Float = Field(0.0, ge=0.0)
    #: demonstrations on goals SFT never trains on (the last ones of the evaluation split, or the
    #: replays after ``demos``), scored after every epoch: ``heldout_nll`` and ``heldout_action_exact``
    #: (the fraction of demonstrated actions whose every token gets p > 0.5, so greedy decoding
    #: reproduces them). Training loss alone cannot tell copying from memorising (docs/webshop.md).
    heldout_demos: StrictInt = Field(0, ge=0)
    #: replace the environment's entity tokens (``model.entity_tokens``) in every training row by
    #: others drawn at random, the same one for each occurrence within the row: an action that
    #: names an entity (a webshop ASIN) can then be predicted only by copying it from the page,
    #: not by remembering it (entity anonymisation, as in reading-comprehension data sets)
    shuffle_entities: StrictBool = False


class EvalConfig(Section):
    temperature: Float = Field(1.0, gt=0.0)
    greedy: StrictBool = False
    concurrency: StrictInt | None = Field(None, ge=1)


class LoggingConfig(Section):
    progress: StrictBool = True
    #: null: TensorBoard logs when it is installed, silently otherwise; true: asked for (warned when missing)
    tensorboard: StrictBool | None = None
    wandb_project: str | None = None
    mlflow_experiment: str | None = None
    #: learner steps between training transcripts in samples.jsonl (0: none; evaluations always write theirs)
    samples_every: StrictInt = Field(10, ge=0)
    #: trajectories written each time, successes and failures alternated
    samples_per_step: StrictInt = Field(4, ge=1)
    #: longest observation, action or error text kept per turn in samples.jsonl (the cut is marked)
    sample_text_chars: StrictInt = Field(4000, ge=100)


class SandboxConfig(Section):
    #: run model-written code at an isolation level weaker than the default safe one (the
    #: sandbox refuses to otherwise); loading a config with it true sets the process-wide
    #: opt-in (streamrl.sandbox.set_allow_weak). See docs/sandbox.md
    allow_weak: StrictBool = False

    @model_validator(mode="after")
    def _apply(self) -> SandboxConfig:
        from streamrl.sandbox import set_allow_weak

        if self.allow_weak:
            set_allow_weak(True)
        return self


class AgentConfig(Section):
    """Train an agent function through the OpenAI-compatible endpoint instead of an environment
    (docs/agents.md): ``function`` is ``path/to/agent.py:run`` or ``package.module:run``."""

    function: str | None = None
    #: JSONL file of tasks (``split`` train by default; ``test`` rows are evaluated)
    tasks: str | None = None
    timeout_s: Float = Field(300.0, gt=0.0)
    #: what the agent's rewards range over (SPO++'s prior and baselines); a reward outside it is refused
    #: (400 over HTTP) and its episode recorded as ``reward_refused``, not trained on
    reward_range: tuple[Float, Float] = (0.0, 1.0)
    #: the most tokens one reply of the endpoint may have (``max_tokens`` above it: 400); a request
    #: without ``max_tokens`` gets ``rollout.max_new_tokens``. While training an agent it is the
    #: reply cap Dr.GRPO's length normaliser assumes (``Config.reply_token_cap``)
    max_tokens: StrictInt = Field(DEFAULT_MAX_TOKENS_CAP, ge=1)
    #: agents in other processes claim the tasks (``streamrl serve --train``) instead of ``function``
    external: StrictBool = False
    #: where the endpoint listens (another host than 127.0.0.1 needs $STREAMRL_ENDPOINT_TOKEN)
    host: str = "127.0.0.1"
    port: StrictInt = Field(0, ge=0, le=65535)

    @field_validator("reward_range")
    @classmethod
    def _bounded_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not -1e6 <= low < high <= 1e6:  # wider and one episode's reward can overflow a loss
            raise ValueError(f"must be [low, high] with -1e6 <= low < high <= 1e6, got {list(value)}")
        return value

    # resolved once, at load: the run's saved config then finds them from any directory
    @field_validator("function")
    @classmethod
    def _absolute_agent_file(cls, value: str | None) -> str | None:
        where, _, name = (value or "").rpartition(":")
        if not where.endswith(".py") or not name:  # package.module:run, or malformed (load_agent says how)
            return value
        return f"{_absolute(where)}:{name}"

    @field_validator("tasks")
    @classmethod
    def _absolute_tasks(cls, value: str | None) -> str | None:
        return None if value is None else _absolute(value)


def _absolute(path: str) -> str:
    """``path`` made absolute against the current directory (``~`` expanded, symlinks kept)."""
    return os.path.abspath(os.path.expanduser(path))


class Config(Section):
    model: ModelConfig = ModelConfig()
    agent: AgentConfig = AgentConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    #: the section of the algorithm ``algo.name`` picks in ``ALGORITHM_TABLE``
    algo: SerializeAsAny[PolicyLossConfig] = ALGORITHM_TABLE["spo++"][0]()
    reward: RewardConfig = RewardConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()
    sandbox: SandboxConfig = SandboxConfig()

    @field_validator("algo", mode="before")
    @classmethod
    def _algo_by_name(cls, value: Any) -> Any:
        return algo_section(value)

    def reply_token_cap(self) -> int:
        """The most tokens one reply can have: ``rollout.max_new_tokens``, or, when an agent writes
        the requests, the endpoint's cap ``agent.max_tokens``."""
        return self.agent.max_tokens if self.agent.function or self.agent.external else self.rollout.max_new_tokens

    def task_label(self) -> str:
        """What a run is labelled with (report titles, folder names): the agent's tasks file, else the environment."""
        return Path(self.agent.tasks).name if self.agent.tasks else self.env.name

    @model_validator(mode="after")
    def _agent_has_tasks(self) -> Config:
        agent = self.agent
        if agent.function is not None and agent.external:
            raise ValueError("agent.function and agent.external exclude each other (one trains an agent function, "
                             "the other agents that claim tasks from the endpoint)")
        if (agent.function is not None or agent.external) != (agent.tasks is not None):
            raise ValueError("agent.tasks (--tasks) goes with agent.function (--agent) or agent.external (serve --train)")
        return self

    @model_validator(mode="after")
    def _group_fits_batch(self) -> Config:
        if isinstance(self.algo, GroupConfig) and self.train.batch_size % self.algo.group_size:
            raise ValueError(
                f"train.batch_size ({self.train.batch_size}) must be a multiple of "
                f"algo.group_size ({self.algo.group_size})"
            )
        return self
