"""The algorithm sections of the configuration and the algorithm table.

Every algorithm has its own section class with the defaults of ``docs/algorithms.md``; the
``algo.name`` field selects it through ``ALGORITHM_TABLE``, the one place an algorithm is named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from streamrl.training.sections import MAX_LR, Float, Section

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]


class PolicyLossConfig(Section):
    if TYPE_CHECKING:
        # each algorithm's section declares the field ``name: Literal[<its table key>]`` (the base has none)
        @property
        def name(self) -> str: ...
    clip_low: Float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: Float = Field(0.28, ge=0.0)
    #: dual-clip constant c (> 1) for negative advantages; null disables it
    dual_clip: Float | None = None
    #: truncated importance-sampling cap against the rollout log-probs; null disables TIS
    tis_cap: Float | None = None
    agg: AggMode = "token-mean"
    #: Dr.GRPO's constant length for ``seq-mean-token-sum-norm`` (null: the longest response)
    norm_length: StrictInt | None = None
    kl_coef: Float = Field(0.0, ge=0.0)
    kl_estimator: KLKind = "k3"
    entropy_coef: Float = Field(0.0, ge=0.0)
    #: PPO epochs over each learner batch, and mini-batches (optimiser steps) per epoch
    epochs: StrictInt = Field(1, ge=1)
    mini_batches: StrictInt = Field(1, ge=1)
    #: trains a separate critic model (memory estimate in ``training/resources.py``)
    trains_critic: ClassVar[bool] = False

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float | None) -> float | None:
        if value is not None and value <= 1.0:
            raise ValueError("must be > 1; use null to disable dual-clip")
        return value

    @field_validator("tis_cap")
    @classmethod
    def _tis_cap_positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0.0:
            raise ValueError("must be > 0; use null to disable TIS")
        return value


class SPOConfig(PolicyLossConfig):
    """SPO: KL-adaptive Beta tracker, trajectory whitening, dual-clip c=10 (docs/algorithms.md §4)."""

    name: Literal["spo"] = "spo"
    dual_clip: Float | None = 10.0
    norm_measure: Literal["traj", "token"] = "traj"
    rho_min: Float = Field(0.875, gt=0.0, lt=1.0)
    rho_max: Float = Field(0.96, gt=0.0, lt=1.0)
    d_half: Float = Field(0.06, gt=0.0)
    #: offline initialisation: rollouts per prompt under the initial policy (0 = unseen prior)
    offline_samples: StrictInt = Field(0, ge=0)
    sampler_eps: Float = Field(0.05, ge=0.0)
    sampler_gamma: Float = Field(0.0, ge=0.0)

    @model_validator(mode="after")
    def _rho_order(self) -> SPOConfig:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min ({self.rho_min}) must be <= rho_max ({self.rho_max})")
        return self


class SPOPlusPlusConfig(PolicyLossConfig):
    """SPO++: event-time memory, token-measure normalisation, dual-clip c=2, TIS<=2 (docs/algorithms.md §5)."""

    name: Literal["spo++"] = "spo++"
    dual_clip: Float | None = 2.0
    tis_cap: Float | None = 2.0
    norm_measure: Literal["token", "traj"] = "token"
    #: "event_time" freezes baselines at dispatch (SPO++); "receipt" reads them when the learner
    #: receives the result and absorbs evidence in receipt order (the ablation "minus event-time memory")
    memory: Literal["event_time", "receipt"] = "event_time"
    retention: Float = Field(0.875, gt=0.0, lt=1.0)
    offline_samples: StrictInt = Field(0, ge=0)
    sampler_eps: Float = Field(0.05, ge=0.0)
    sampler_gamma: Float = Field(0.0, ge=0.0)


class GroupConfig(PolicyLossConfig):
    """Algorithms that roll out ``group_size`` episodes per prompt (``train.batch_size`` must be a
    multiple of it)."""

    group_size: StrictInt = Field(8, ge=2)


class GRPOConfig(GroupConfig):
    """GRPO / Dr.GRPO: synchronous groups, group-relative advantages (docs/algorithms.md §2)."""

    name: Literal["grpo"] = "grpo"
    clip_high: Float = Field(0.2, ge=0.0)
    #: false = Dr.GRPO (no std division; pair it with agg: seq-mean-token-sum-norm)
    scale_by_std: StrictBool = True


class ValueConfig(PolicyLossConfig):
    """Turn-level GAE settings shared by PPO (separate critic) and SAPO (value tokens)."""

    clip_high: Float = Field(0.2, ge=0.0)
    gamma: Float = Field(0.99, ge=0.0, le=1.0)
    lam: Float = Field(0.95, ge=0.0, le=1.0)
    value_clip: Float = Field(0.5, gt=0.0)
    truncation: Literal["terminal", "bootstrap"] = "terminal"


class PPOConfig(ValueConfig):
    """PPO with a separate critic model and turn-level GAE (docs/algorithms.md §3)."""

    name: Literal["ppo"] = "ppo"
    trains_critic: ClassVar[bool] = True
    critic_lr: Float = Field(1e-5, gt=0.0, le=MAX_LR)
    critic_warmup: StrictInt = Field(0, ge=0)
    norm_measure: Literal["turn", "token", "none"] = "turn"


class SAPOConfig(ValueConfig):
    """SAPO: one model is policy, V and Q via two reserved value tokens (docs/algorithms.md §6)."""

    name: Literal["sapo"] = "sapo"
    kl_coef: Float = Field(0.01, ge=0.0)
    value_coef: Float = Field(0.5, ge=0.0)
    q_coef: Float = Field(0.5, ge=0.0)
    entropy_coef: Float = Field(0.001, ge=0.0)
    value_tau: Float = Field(1.0, gt=0.0)
    value_squash: Literal["clip", "tanh"] = "clip"
    #: subtracted from a turn's advantage when its action format was invalid (units of r_max)
    invalid_penalty: Float = Field(0.1, ge=0.0)
    norm_measure: Literal["turn", "token"] = "turn"


#: The algorithm table: ``algo.name`` -> (its config section, its algorithm class or ``"module:Class"``,
#: a string imported only when a learner is built, so loading a config stays free of torch). The
#: ``algo`` section's validation and the per-algorithm field sets derive from it. Algorithms enter it
#: through ``register_algorithm``, the shipped ones included.
ALGORITHM_TABLE: dict[str, tuple[type[PolicyLossConfig], Any]] = {}


def register_algorithm(name: str, section: type[PolicyLossConfig], algorithm: Any) -> None:
    """Make ``algo.name: name`` train with ``algorithm`` (a class satisfying
    ``streamrl.training.algorithms.base.Algorithm``, or ``"module:Class"``), configured by ``section``
    (a ``PolicyLossConfig`` subclass whose ``name`` defaults to ``name``). Registering the same name
    again replaces it."""
    if not (isinstance(section, type) and issubclass(section, PolicyLossConfig)):
        raise TypeError(f"register_algorithm({name!r}): section must be a PolicyLossConfig subclass")
    if section.model_fields["name"].default != name:
        raise ValueError(f"register_algorithm({name!r}): {section.__name__}.name must default to {name!r}")
    if not (isinstance(algorithm, type) or (isinstance(algorithm, str) and ":" in algorithm)):
        raise TypeError(f"register_algorithm({name!r}): algorithm must be a class or 'module:Class'")
    ALGORITHM_TABLE[name] = (section, algorithm)


register_algorithm("spo", SPOConfig, "streamrl.training.algorithms.spo:SPO")
register_algorithm("spo++", SPOPlusPlusConfig, "streamrl.training.algorithms.spo_pp:SPOPlusPlus")
register_algorithm("grpo", GRPOConfig, "streamrl.training.algorithms.grpo:GRPO")
register_algorithm("ppo", PPOConfig, "streamrl.training.algorithms.ppo:PPO")
register_algorithm("sapo", SAPOConfig, "streamrl.training.algorithms.sapo:SAPO")
#: the shipped algorithms (command-line choices)
ALGORITHMS = tuple(ALGORITHM_TABLE)


def algo_section(value: Any) -> Any:
    """A mapping -> the validated section of the algorithm its ``name`` picks in the table."""
    if not isinstance(value, dict):
        return value
    name = value.get("name")
    if name not in ALGORITHM_TABLE:
        allowed = ", ".join(repr(key) for key in ALGORITHM_TABLE)
        raise ValueError(f"unknown algorithm name {name!r} (allowed: {allowed})")
    return ALGORITHM_TABLE[name][0].model_validate(value)


def algo_fields(name: str) -> set[str]:
    """The fields of algorithm ``name``'s section."""
    return set(ALGORITHM_TABLE[name][0].model_fields)
