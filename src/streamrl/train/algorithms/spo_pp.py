"""SPO++ (docs/algorithms.md §5): event-time prompt memory with baselines frozen at dispatch,
action-token-measure normalisation, dual-clip c=2, truncated importance weights.

Ablations are configuration: ``norm_measure: traj`` (minus token-measure normalisation) and
``memory: receipt`` (minus event-time memory: baselines read when the learner receives a result,
evidence absorbed in receipt order at the learner's current event).
"""

from __future__ import annotations

from streamrl.algos import EventTimeTracker
from streamrl.rollout import Trajectory
from streamrl.train.algorithms.single_stream import TrackerLearner, baseline_advantages, clamp_reward
from streamrl.train.batch import Batch
from streamrl.train.learner import Prepared


class SPOPlusPlusLearner(TrackerLearner):
    name = "spo++"

    def __init__(self, config, policy, reference=None, reward_range=(0.0, 1.0)):
        super().__init__(config, policy, reference, reward_range)
        self.tracker = EventTimeTracker(
            retention=self.algo.retention,
            reward_range=self.reward_range,
            eps_s=self.algo.sampler_eps,
            gamma=self.algo.sampler_gamma,
        )
        self.event_time = self.freeze = self.algo.memory == "event_time"
        self._receipt_baselines: dict[str, float] = {}

    def observe(self, trajectories: list[Trajectory]) -> dict[str, float]:
        if self.event_time:
            return {"event_z": self.tracker.z}
        # receipt order: read every baseline first (duplicates share the pre-batch value), then absorb
        self._receipt_baselines = {t.request_id: self.tracker.baseline(t.prompt_id) for t in trajectories}
        for t in trajectories:
            if t.outcome is not None:
                self.tracker.record(t.prompt_id, self.tracker.z, clamp_reward(self.tracker, self.outcome(t)), t.request_id)
        return {"event_z": self.tracker.z}

    def baseline(self, trajectory: Trajectory) -> float:
        if not self.event_time:
            return self._receipt_baselines[trajectory.request_id]
        if trajectory.dispatch.baseline is None:
            raise RuntimeError(f"trajectory {trajectory.request_id} carries no frozen baseline (was it dispatched by SPO++?)")
        return trajectory.dispatch.baseline

    def prepare(self, batch: Batch, old) -> Prepared:
        return baseline_advantages(batch, [self.baseline(t) for t in batch.trajectories], self.algo.norm_measure)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.tracker.load_state_dict(state["tracker"])
