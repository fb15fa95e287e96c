"""``train.learner_processes``: one learner step in two processes (FSDP2 over gloo, the second
process spawned by streamrl) lands on the same weights, loss and algorithm state as the same step in
one process, for every algorithm; ``Ranks.share`` pairs every rank's passes; a killed learner
process stops the run in one line, and the resume (with another number of processes) goes on."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from streamrl.training.assemble import make_learner
from streamrl.training.data_parallel import (
    DataParallelLearner,
    free_port,
    gather_trained,
    join_group,
    load_sharded_optimizer,
    sharded_learner,
)
from streamrl.training.loggers import read_metrics
from streamrl.training.ranks import Ranks
from streamrl.training.run import REFERENCE_FOLDER, load_reference, load_run_policy

#: every algorithm, and SPO++ with LoRA on the top block (adapters sharded, the lower block frozen)
CASES = [("spo++", ()), ("spo", ()), ("grpo", ("algo.group_size=4",)), ("ppo", ()), ("sapo", ()),
         ("spo++", ("model.lora={r: 4, alpha: 8}", "model.train_top_layers=1"))]


def _rollouts(config, play):
    trajectories = play(config, load_run_policy(config, None))
    for index, t in enumerate(trajectories):  # half succeed, whatever was sampled: every advantage is non-zero
        t.turns[-1].reward = float(index % 2)
        t.outcome = sum(turn.reward for turn in t.turns)
        # GRPO: two groups of four; SPO++: a baseline and event coordinate frozen at dispatch
        t.dispatch = dataclasses.replace(t.dispatch, group_id=f"group-{index // 4}", baseline=0.5, z=0.0)
    return trajectories


def _learner(config, run_folder):
    """A fresh learner; with a KL penalty (SAPO's default) its reference is saved in ``run_folder``
    as a run keeps it, where the other learner processes read it."""
    torch.manual_seed(0)
    policy = load_run_policy(config, None)
    policy.limit_training(top_layers=config.model.train_top_layers)
    reference = None
    if config.algo.kl_coef > 0:
        policy.save(run_folder / REFERENCE_FOLDER)
        reference = load_reference(run_folder, config)
    return make_learner(config, policy, reference)


@pytest.mark.parametrize(("algo", "extra"), CASES, ids=["spo++", "spo", "grpo", "ppo", "sapo", "spo++ lora"])
def test_two_learner_processes_take_the_same_step_as_one(coin_config, coin_rollouts, algo, extra, tmp_path):
    # 8 rows in micro-batches of 3: three passes, so the second rank also runs a pass that counts 0
    lr = 0.05
    # AdamW's epsilon well above float noise: with 1e-8 a gradient element near 0 steps by about
    # lr * sign(grad), so a rounding difference in the summation order could flip a whole step
    # float32: summed in another order, bfloat16 products (dtype auto on an AMX machine) round past
    # the bound below (measured: every full-model case failed on an AMX Xeon)
    config = coin_config(algo, f"optim.lr={lr}", "optim.eps=1e-4", "train.batch_size=8", "optim.micro_batch_size=3",
                         "model.dtype=float32", *extra)
    trajectories = _rollouts(config, coin_rollouts)

    single = _learner(config, tmp_path)
    before = {n: t.detach().clone() for n, t in single.policy.model.state_dict().items()}
    critic_before = single.critic.model.state_dict() if single.critic else {}
    critic_before = {n: t.detach().clone() for n, t in critic_before.items()}
    single_metrics = [single.step(trajectories), single.step(trajectories)]

    two = DataParallelLearner(_learner(config, tmp_path), config, None, (0.0, 1.0), 2, 1, str(tmp_path))
    try:
        two_metrics = [two.step(trajectories), two.step(trajectories)]  # the second from AdamW's moments
        tensor_state = two.tensor_state()
        if single.critic:  # PPO's critic is sharded too, not replicated
            assert isinstance(next(two.local.critic.model.decoder.layers[0].parameters()), DTensor)
    finally:
        two.close()

    _assert_same_step(single.policy.model.state_dict(), two.canonical.model.state_dict(), before)
    assert any(not torch.equal(a, before[n]) for n, a in single.policy.model.named_parameters())
    if single.critic:
        _assert_same_step(single.critic.model.state_dict(), tensor_state["critic"], critic_before)
    losses = ("loss", "policy_loss", "grad_norm", "entropy", *(["kl_ref"] if config.algo.kl_coef > 0 else []),
              *(["critic_loss", "critic_grad_norm"] if single.critic else []))
    for ours, theirs in zip(single_metrics, two_metrics):
        for key in losses:
            assert theirs[key] == pytest.approx(ours[key], rel=1e-4, abs=1e-6), key
    assert two_metrics[0]["learner_processes"] == 2.0
    _assert_same_state(two.state_dict(), single.state_dict())  # trackers, prior, drift, steps
    # the checkpoint's optimiser state, gathered by name, loads into a one-process learner
    resumed = _learner(config, tmp_path)
    resumed.load_tensor_state(tensor_state)
    names = [n for n, p in resumed.policy.model.named_parameters() if p.requires_grad]
    moments = {n: resumed.optimizer.state[p]["exp_avg"] for n, p in resumed.policy.model.named_parameters()
               if p.requires_grad}
    expected = {n: single.optimizer.state[p]["exp_avg"] for n, p in single.policy.model.named_parameters()
                if p.requires_grad}
    for name in names:
        torch.testing.assert_close(moments[name], expected[name], rtol=1e-4, atol=1e-7, msg=name)


def _assert_same_step(ours, theirs, before):
    """The same weights after the same step(s), each within a thousandth of its own step."""
    assert ours.keys() == theirs.keys()
    for name, a in ours.items():
        b = theirs[name]
        step = float((a - before[name]).abs().max())
        if step == 0.0:
            assert torch.equal(b, a), name  # frozen (or untouched) in one process: so in two
            continue
        # the gradients are summed in another order, and Adam divides by their root mean square:
        # an element whose micro-batch gradients nearly cancel differs by float noise times a step
        assert float((b - a).abs().max()) <= 1e-3 * step, name


def _assert_same_state(ours, theirs):
    """Equal JSON states, floats within float32 rounding of the weights they were measured on."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
        for key in ours:
            _assert_same_state(ours[key], theirs[key])
    elif isinstance(ours, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _assert_same_state(a, b)
    elif isinstance(ours, float):
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    else:
        assert ours == theirs


def test_every_rank_makes_the_same_number_of_passes():
    items = list(range(5))
    shares = [Ranks(rank, 2).share(items) for rank in range(2)]
    assert [len(share) for share in shares] == [3, 3]
    live = sorted(item for share in shares for item, is_live in share if is_live)
    assert live == items  # each item once, on one rank
    assert shares[1][-1] == (0, False)
    assert Ranks().share(items) == [(item, True) for item in items]
    assert Ranks(1, 2).loss_weight(True) == 2.0 and Ranks(1, 2).loss_weight(False) == 0.0


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the parent pid
            children.append(int(stat.parent.name))
    return children


def _two_learner_processes_at_step_2(argv: list[str], out: Path) -> tuple[subprocess.Popen, list[int]]:
    """A run started with two learner processes, once its step-2 checkpoint is written; the pids
    of the learner processes it spawned."""
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    manifest = out / "checkpoints" / "step_00000002" / "manifest.json"
    deadline = time.monotonic() + 240
    while not manifest.exists():
        assert run.poll() is None, run.stdout.read()
        assert time.monotonic() < deadline, "no step-2 checkpoint in time"
        time.sleep(0.05)
    helpers = [pid for pid in _children(run.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert helpers, "the second learner process is not a child of the training process"
    return run, helpers


def test_a_killed_learner_process_stops_the_run_in_one_line_and_the_resume_goes_on(tmp_path):
    out, steps = tmp_path / "run", 6
    args = [sys.executable, "-m", "streamrl", "train", "--out", str(out), "--config", "configs/smoke.yaml",
            f"train.steps={steps}", "train.checkpoint_every=2", "train.eval_at_start=false", "env.eval_tasks=2",
            "sft.demos=4"]
    run, helpers = _two_learner_processes_at_step_2([*args, "train.learner_processes=2"], out)
    os.kill(helpers[0], signal.SIGKILL)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert f"learner process rank 1 (pid {helpers[0]}) died (killed by SIGKILL)" in last
    assert f"continue with: streamrl train --out {out} --resume" in last

    # the resume takes another number of learner processes (one): the checkpoint is gathered
    resumed = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == list(range(1, steps + 1))


@pytest.mark.slow
def test_a_stopped_learner_process_ends_the_run_in_one_line_within_the_heartbeat_bound(tmp_path):
    """SIGSTOP keeps a rank alive and silent: without a heartbeat the trainer waited 30 minutes in
    a collective. Now the watchdog kills it once its heartbeat is older than the bound."""
    out = tmp_path / "run"
    run, (helper,) = _two_learner_processes_at_step_2(
        [sys.executable, "-m", "streamrl", "train", "--out", str(out), "--config", "configs/smoke.yaml", "train.steps=400",
         "train.checkpoint_every=2", "train.eval_at_start=false", "env.eval_tasks=2", "sft.demos=4",
         "train.learner_processes=2", "train.learner_heartbeat_s=10"], out)
    stopped = time.monotonic()
    os.kill(helper, signal.SIGSTOP)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert f"learner process rank 1 (pid {helper}) died (silent for" in last and "train.learner_heartbeat_s=10" in last
    assert f"continue with: streamrl train --out {out} --resume" in last
    assert time.monotonic() - stopped < 60  # the bound and a step, not the collective's 30 minutes


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_step_through_fsdp_in_one_process_equals_the_plain_step(coin_config, coin_rollouts, device, tmp_path):
    """The sharded path with one process: FSDP2's collectives run (gloo, or NCCL on a GPU, which
    ``scripts/gpu_check.sh`` runs) and change nothing of the step."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    lr = 0.05
    config = coin_config("spo++", f"optim.lr={lr}", "optim.eps=1e-4", "train.batch_size=8",
                         "optim.micro_batch_size=3", f"model.device={device}")
    trajectories = _rollouts(config, coin_rollouts)
    plain = _learner(config, tmp_path)
    before = {n: p.detach().clone() for n, p in plain.policy.model.named_parameters()}
    plain.step(trajectories)

    canonical = _learner(config, tmp_path)
    join_group(0, 1, free_port(), device)
    try:
        sharded = sharded_learner(config, canonical.policy, canonical.algorithm, Ranks(0, 1))
        load_sharded_optimizer(sharded.model, sharded.optimizer, None)
        sharded.step(trajectories)
        gather_trained(sharded.model, canonical.policy.model)
    finally:
        torch.distributed.destroy_process_group()
    for (name, a), b in zip(plain.policy.model.named_parameters(), canonical.policy.model.parameters(), strict=True):
        a = a.detach()
        step = float((a - before[name]).abs().max())
        b = b.detach()
        assert float((b - a).abs().max()) <= 1e-3 * step or step == 0.0 and torch.equal(a, b), name
    assert any(not torch.equal(p.detach(), before[n]) for n, p in canonical.policy.model.named_parameters())
