"""SPO++ (docs/algorithms.md §5): event-time prompt memory with baselines frozen at dispatch,
action-token-measure normalisation, dual-clip c=2, truncated importance weights.

Ablations are configuration: ``norm_measure: traj`` (minus token-measure normalisation) and
``memory: receipt`` (minus event-time memory: baselines read when the learner receives a result,
evidence absorbed after the step in receipt order at the learner's current event).
"""

from __future__ import annotations

from typing import Any

from streamrl.algos import EventTimeTracker
from streamrl.rollout import PromptSource, Trajectory
from streamrl.training.algo_config import SPOPlusPlusConfig
from streamrl.training.algorithms.base import Defaults, Prepared, Setup
from streamrl.training.algorithms.single_stream import TrackerSource, baseline_advantages, clamp_reward, offline_prior
from streamrl.training.batch import Batch


class SPOPlusPlus(Defaults):
    def __init__(self, config: SPOPlusPlusConfig, setup: Setup):
        self.config = config
        self.setup = setup
        self.tracker = EventTimeTracker(
            retention=config.retention,
            reward_range=setup.reward_range,
            eps_s=config.sampler_eps,
            gamma=config.sampler_gamma,
        )
        self.warm_start = offline_prior(self.tracker, setup, config.offline_samples)
        self.event_time = config.memory == "event_time"

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return TrackerSource(prompt_ids, self.tracker, self.setup.outcome, freeze=self.event_time)

    def baseline(self, trajectory: Trajectory) -> float:
        if not self.event_time:  # receipt order: read now, before ``after_update`` absorbs the batch
            return self.tracker.baseline(trajectory.prompt_id)
        if trajectory.dispatch.baseline is None:
            raise RuntimeError(f"trajectory {trajectory.request_id} carries no frozen baseline (was it dispatched by SPO++?)")
        return trajectory.dispatch.baseline

    def advantages(self, batch: Batch, old: Any, step: int) -> Prepared:
        return baseline_advantages(batch, [self.baseline(t) for t in batch.trajectories], self.config.norm_measure)

    def after_update(self, delivered: list[Trajectory], drift: float | None) -> dict[str, float]:
        if not self.event_time:  # event time records each result on arrival (``TrackerSource``)
            for t in delivered:
                if t.outcome is not None:
                    self.tracker.record(t.prompt_id, self.tracker.z, clamp_reward(self.tracker, self.setup.outcome(t)), t.request_id)
        return {"event_z": self.tracker.z}

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
