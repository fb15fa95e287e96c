"""Issue 12: training refuses to silently go wrong. A dead environment, a batch with nothing to
train on and non-finite numbers stop it with one line; the last good checkpoint stays resumable."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from streamrl import cli
from streamrl.envs import register
from streamrl.rollout import DeadEnvironmentError
from streamrl.training.checkpoint import latest_valid, list_checkpoints
from streamrl.training.errors import NonFiniteError, TrainingError
from streamrl.training.learner import Learner
from streamrl.training.loop import require_outcomes, train

from .conftest import AnyText, CoinEnv, CoinPrompt

QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.samples_every=0"]


class DeadEnv(CoinEnv):
    def reset(self, seed=None, task_id=None, options=None):
        raise RuntimeError("no such task")


register("dead_coin", DeadEnv, AnyText, CoinPrompt, overwrite=True)


def test_a_dead_environment_stops_training_with_one_line(tmp_path, capsys):
    args = ["train", "--config", "configs/smoke.yaml", "--algo", "spo++", "--out", str(tmp_path / "run"),
            "env.name=dead_coin", "env.prompt={}", "env.parser={}", "sft.demos=0", "train.eval_at_start=false",
            "rollout.max_new_tokens=6", "train.steps=3", "model.dtype=float32", *QUIET]
    assert cli.main(args) == 1  # an explicit dtype: `auto` announces its choice once per process
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'dead_coin'" in err and "no such task" in err and "in a row" in err
    assert "never retrieved" not in err
    assert not (tmp_path / "run" / "final_model").exists() and not list_checkpoints(tmp_path / "run" / "checkpoints")


def test_a_batch_in_which_every_episode_crashed_is_never_trained_on():
    class Crashed:
        outcome, end_reason, error = None, "engine_error", "generate raised OSError: gone"

    with pytest.raises(TrainingError, match=r"step 4: all 2 episodes .*\(engine_error: generate raised OSError: gone\)"):
        require_outcomes([Crashed(), Crashed()], 4)
    assert issubclass(DeadEnvironmentError, Exception)


# -- config bounds, before any work -------------------------------------------------------------


@pytest.mark.parametrize(
    "override, field",
    [
        ("optim.lr=.inf", "optim.lr"), ("optim.lr=1e30", "optim.lr"), ("optim.lr=.nan", "optim.lr"),
        ("sft.lr=2", "sft.lr"), ("train.steps=true", "train.steps"), ("train.batch_size=false", "train.batch_size"),
        ("optim.betas=[true,0.9]", "optim.betas"), ("env.train_tasks=100000000", "env.train_tasks"),
        ("rollout.temperature=.inf", "rollout.temperature"),
    ],
)
def test_silly_values_are_refused_with_one_line_naming_the_field(tmp_path, capsys, override, field):
    assert cli.main(["train", "--config", "configs/smoke.yaml", "--out", str(tmp_path / "run"), override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"error: {field}" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, field",
    [("model.overrides={hidden_size: 100000}", "model.overrides"), ("train.batch_size=1000000", "train.batch_size")],
)
def test_runs_that_cannot_fit_in_memory_are_refused_before_allocating(tmp_path, capsys, override, field):
    import time

    started = time.monotonic()
    assert cli.main(["train", "--config", "configs/smoke.yaml", "--out", str(tmp_path / "run"), override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"error: {field}:" in err and "GiB is available" in err, err
    assert time.monotonic() - started < 30 and not (tmp_path / "run").exists()


def test_the_memory_budget_sizes_the_engines_kv_and_refuses_what_does_not_fit(tmp_path, capsys):
    """``model.memory_gb``: the engine's kept KV within a quarter of it (SmolLM2: 46,080 bytes a
    token), a model that needs more refused in one line before anything starts, and a budget above
    what the machine has refused too."""
    from streamrl.training.config_files import load_config
    from streamrl.training.resources import GIB, KV_SHARE, engine_prefix_tokens, kv_bytes_per_token

    model = "model.overrides={num_hidden_layers: 4, num_key_value_heads: 2}"
    config = load_config("configs/smoke.yaml", [model])
    per_token = kv_bytes_per_token(config)
    deeper = kv_bytes_per_token(load_config("configs/smoke.yaml", ["model.overrides={num_hidden_layers: 8, num_key_value_heads: 2}"]))
    assert per_token and deeper == 2 * per_token  # keys and values of every layer
    roomy = engine_prefix_tokens(config)
    assert roomy == max(config.rollout.concurrency, config.eval.concurrency or 0) * config.rollout.max_context_tokens
    tight_gb = 4 * roomy * per_token / GIB / 8  # room for an eighth of it
    tight = engine_prefix_tokens(load_config("configs/smoke.yaml", [model, f"model.memory_gb={tight_gb}"]))
    assert config.rollout.max_context_tokens <= tight < roomy and tight * per_token <= KV_SHARE * tight_gb * GIB + per_token
    argv = ["train", "--config", "configs/smoke.yaml", "--out", str(tmp_path / "run")]
    assert cli.main([*argv, "model.overrides={hidden_size: 4096, intermediate_size: 8192}", "model.memory_gb=0.05"]) == 2
    assert "error: model.overrides: the model has" in capsys.readouterr().err
    assert cli.main([*argv, "model.memory_gb=100000"]) == 2
    assert "model.memory_gb: 100000 GiB asked, but" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_memory_estimates_scale_with_the_config(coin_config):
    from streamrl.training.resources import batch_bytes, check_resources, parameter_count

    config = coin_config("spo++")
    small = parameter_count(config)
    assert small is not None and 0 < small < 50_000_000
    check_resources(config)  # the test configs fit
    wide = coin_config("spo++", "model.overrides={hidden_size: 4096, intermediate_size: 8192}")
    assert parameter_count(wide) > 10 * small
    with pytest.raises(Exception, match="model.overrides: .* GiB is available"):
        check_resources(wide, available=parameter_count(wide))  # one byte per parameter: too little
    assert batch_bytes(coin_config("spo++", "train.batch_size=64")) == 2 * batch_bytes(coin_config("spo++", "train.batch_size=32"))


# -- the non-finite guard ------------------------------------------------------------------------


def _coin_run(coin_config, out, *overrides, resume=False):
    config = coin_config("spo++", "train.batch_size=4", "rollout.concurrency=4", "train.checkpoint_every=1",
                         "train.keep_checkpoints=3", "env.eval_tasks=2", *QUIET, *overrides)
    return asyncio.run(train(config, out, resume=resume, echo=lambda *_: None))


def _finite_checkpoint(checkpoint) -> bool:
    from safetensors.torch import load_file

    tensors = {}
    for file in (checkpoint.path / "policy").glob("*.safetensors"):
        tensors.update(load_file(file))
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors.values())


@pytest.mark.parametrize("fault, quantity", [("lr", "parameter"), ("loss", "loss"), ("grad", "gradient norm")])
def test_a_non_finite_step_stops_training_and_the_last_good_checkpoint_resumes(coin_config, tmp_path, monkeypatch, fault, quantity):
    original = Learner.step

    def faulty_step(self, trajectories):
        if self.steps_done == 2:  # the third step goes wrong
            if fault == "lr":
                for group in self.optimizer.param_groups:
                    group["lr"] = math.inf  # what optim.lr=.inf did before the config refused it
            elif fault == "loss":
                with torch.no_grad():
                    self.model.get_output_embeddings().weight[0, 0] = math.nan
            else:
                self.model.get_output_embeddings().weight.register_hook(lambda grad: grad * math.inf)
        return original(self, trajectories)

    monkeypatch.setattr(Learner, "step", faulty_step)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError) as stopped:
        _coin_run(coin_config, out, "train.steps=4")
    message = str(stopped.value)
    assert "\n" not in message and message.startswith("step 3: non-finite") and quantity in message, message
    assert [c.step for c in list_checkpoints(out / "checkpoints")] == [2, 1]  # nothing of step 3 saved
    assert not (out / "final_model").exists()
    newest = latest_valid(out / "checkpoints")
    assert newest.step == 2 and _finite_checkpoint(newest)

    if fault != "lr":
        return
    monkeypatch.setattr(Learner, "step", original)
    summary = _coin_run(coin_config, out, "train.steps=3", resume=True)
    assert summary["steps"] == 3 and _finite_checkpoint(latest_valid(out / "checkpoints"))
