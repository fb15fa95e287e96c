"""SPO (docs/algorithms.md §4): a KL-adaptive Beta tracker per prompt, read when the learner receives a
result, trajectory whitening (``norm_measure: token`` is the ablation "SPO + token measure"),
dual-clip c=10.

Drift (our choice, the spec's ``drift="global"`` option): after every update the learner measures
the mean absolute log-ratio between the updated and the previous policy on the first micro-batch
of the update (``measures_drift``); SPO adds it to a running total, and a prompt's drift ``D(x)``
is the growth of that total since its previous visit. This needs no per-prompt response storage
and one small extra forward.
"""

from __future__ import annotations

from typing import Any

from streamrl.algos import SPOTracker
from streamrl.rollout import PromptSource, Trajectory
from streamrl.training.algo_config import SPOConfig
from streamrl.training.algorithms.base import Defaults, Prepared, Setup
from streamrl.training.algorithms.single_stream import TrackerSource, baseline_advantages, clamp_reward, offline_prior
from streamrl.training.batch import Batch


class SPO(Defaults):
    measures_drift = True

    def __init__(self, config: SPOConfig, setup: Setup):
        self.config = config
        self.setup = setup
        self.tracker = SPOTracker(
            rho_min=config.rho_min,
            rho_max=config.rho_max,
            d_half=config.d_half,
            reward_range=setup.reward_range,
            eps_s=config.sampler_eps,
            gamma=config.sampler_gamma,
        )
        self.warm_start = offline_prior(self.tracker, setup, config.offline_samples)
        self.total_drift = 0.0
        self.drift_at_visit: dict[str, float] = {}

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return TrackerSource(prompt_ids, self.tracker, self.setup.outcome, freeze=False)

    def advantages(self, batch: Batch, old: Any, step: int) -> Prepared:
        # read before the update (the tracker absorbs this batch in ``after_update``): duplicates
        # of a prompt in one batch share the pre-step value
        baselines = [self.tracker.baseline(t.prompt_id) for t in batch.trajectories]
        return baseline_advantages(batch, baselines, self.config.norm_measure)

    def after_update(self, delivered: list[Trajectory], drift: float | None) -> dict[str, float]:
        assert drift is not None  # measures_drift: the learner always passes it
        self.total_drift += drift
        rhos = []
        for t in delivered:  # sequentially, in receipt order
            if t.outcome is None:
                continue  # crashed: no evidence, tracker untouched
            visit_drift = self.total_drift - self.drift_at_visit.get(t.prompt_id, self.total_drift)
            rhos.append(self.tracker.forgetting_factor(visit_drift))
            self.tracker.update(t.prompt_id, clamp_reward(self.tracker, self.setup.outcome(t)), drift=visit_drift)
            self.drift_at_visit[t.prompt_id] = self.total_drift
        return {"policy_drift": drift, "rho_mean": sum(rhos) / len(rhos) if rhos else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "total_drift": self.total_drift, "drift_at_visit": dict(self.drift_at_visit)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.total_drift = float(state["total_drift"])
        self.drift_at_visit = dict(state["drift_at_visit"])
