#!/usr/bin/env bash
# Prepared for the next lent GPU (issue 50), one call of about 2.5 minutes, from the repository root: parameter homes
# on CUDA for outside models whose weights are read through views (Falcon's `x @ weight.T`), past a metadata check
# (Gemma2's, Cohere's, Mamba's and RecurrentGemma's `weight.to(dtype)`) or by several ops (tied embeddings: Gemma2,
# BLOOM; ALBERT's shared layers; Mamba's A_log, through one view two ops read), never run on CUDA yet. Every op on gpu:0 (cuda:0) and every parameter that can
# live apart homed on cpu:0: the copies from pinned memory on side streams, the window of two, views of a copy
# refilled before the backward, a copy per reader whose gradients add up on the host; three Adam
# steps against the same plan without homes and three SGD steps against the unplaced model on CUDA, to 1e-4
# (docs/conformance/others.py, homed_check). On this CPU the same check runs to the bit:
#     DEVICE_MAP='*=cpu' bash docs/gpu_calls/h200-next-homes-views.sh
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  PYTHONPATH=. PYTHONUNBUFFERED=1 timeout --signal=INT "${DEADLINE:-240}" python3 docs/conformance/others.py --homes \
    --device-map "${DEVICE_MAP:-gpu:0=cuda:0}" falcon gemma2 cohere mamba recurrent_gemma deberta bloom albert gptj olmo2
  echo "rc $?"
  # the corpus's nn.Transformer and nn.TransformerDecoder: each cross attention's linears copy their part of its
  # packed projection (envs.real.homes.part_read), on CUDA through a dense part of pinned memory
  PYTHONPATH=. PYTHONUNBUFFERED=1 timeout --signal=INT 60 python3 docs/conformance/others.py --homes --corpus \
    --device-map "${DEVICE_MAP:-gpu:0=cuda:0}" nn_transformer nn_decoder
  echo "rc $?"
} 2>&1 | grep --line-buffered -v "Warning\|warnings.warn\|warn(" | tee "$OUT/others-homes-cuda.log"
