"""``streamrl.algos``: the algorithm core of GRPO, PPO+GAE, SPO, SPO++ and SAPO as pure tensor math.

No I/O, no models, no imports from other streamrl packages. Formulas and choices are documented in
``docs/algorithms.md``.
"""

from streamrl.algos.advantages import sapo_advantages, spo_advantages, spopp_advantages
from streamrl.algos.aggregation import AGGREGATION_MODES, AggregationMode, aggregate
from streamrl.algos.beta_memory import (
    BetaPromptMemory,
    forgetting_factor,
    offline_prior,
    policy_drift,
    prior_strength,
    sampling_weight,
)
from streamrl.algos.event_tracker import EventTimeTracker, MemoryRead
from streamrl.algos.gae import masked_gae, turn_gae_batched
from streamrl.algos.grpo import grpo_advantages, grpo_group_stats
from streamrl.algos.losses import (
    check_dual_clip,
    clipped_surrogate,
    kl_estimate,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)
from streamrl.algos.metrics import (
    PairedDifference,
    align_curves,
    final_reward,
    interpolate,
    learning_auc,
    normalize_rewards,
    paired_difference,
    step_mean_auc,
    union_grid,
)
from streamrl.algos.normalize import advantage_stats, token_measure_whiten, turn_normalize, whiten
from streamrl.algos.spo_tracker import SPOTracker
from streamrl.algos.student_t import t_cdf, t_quantile
from streamrl.algos.values import (
    SapoTargets,
    invalid_action_correction,
    sapo_targets,
    sapo_value_loss,
    sarsa_targets,
    value_readout,
    value_saturation_frac,
)
from streamrl.algos.vocab import action_log_probs, action_log_probs_and_entropy, entropy, mask_excluded_logits

__all__ = [
    "AGGREGATION_MODES",
    "AggregationMode",
    "BetaPromptMemory",
    "EventTimeTracker",
    "MemoryRead",
    "PairedDifference",
    "SPOTracker",
    "SapoTargets",
    "action_log_probs",
    "action_log_probs_and_entropy",
    "advantage_stats",
    "aggregate",
    "align_curves",
    "check_dual_clip",
    "clipped_surrogate",
    "entropy",
    "final_reward",
    "forgetting_factor",
    "grpo_advantages",
    "grpo_group_stats",
    "interpolate",
    "invalid_action_correction",
    "kl_estimate",
    "learning_auc",
    "mask_excluded_logits",
    "masked_gae",
    "normalize_rewards",
    "offline_prior",
    "paired_difference",
    "policy_drift",
    "ppo_policy_loss",
    "prior_strength",
    "sampling_weight",
    "sapo_advantages",
    "sapo_targets",
    "sapo_value_loss",
    "sarsa_targets",
    "spo_advantages",
    "spopp_advantages",
    "step_mean_auc",
    "t_cdf",
    "t_quantile",
    "tis_weights",
    "token_measure_whiten",
    "turn_gae_batched",
    "turn_normalize",
    "union_grid",
    "value_loss",
    "value_readout",
    "value_saturation_frac",
    "whiten",
]
