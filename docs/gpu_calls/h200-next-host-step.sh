#!/usr/bin/env bash
# Prepared for the next lent GPU (issue 50), one call of about 3 minutes, from the repository root: homed parameters
# stepped during the backward (host_step "backward", placer.apply.step_in_backward) on CUDA, never run there yet.
#   1. the check: FSDP2's offload as a plan, applied to the wide MLP and nn.Transformer, stepping during the backward
#      against stepping after it, 3 fused-Adam steps each: losses and weights within 1e-5 (bit-equal on this CPU);
#      this runs the worker's wait for each gradient's copy home (an event on the copy's stream), ~1 min;
#   2. the timing: the same plan pair for the wide MLP by `placer run`, 5 rounds alternated, a median of 10 steps
#      each (on this CPU: 0.829x stepped after, BENCHMARKS.md "Homed parameters stepped during the backward"), ~1 min;
#   3. the GPU machine host's step_call_s (python -m bench.host_step_call: one fused Adam call's fixed cost;
#      18.7-21.6 us on this CPU, 20 us the default), ~10 s.
# The 1.54 B and 3 B models' plans step during the backward too: scripts/gpu_offload.sh homes measures them, with
# the stepped-after ablation right after placer's plan. On this CPU the same call runs with
#     DEVICE_MAP='*=cpu' bash docs/gpu_calls/h200-next-host-step.sh
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
mkdir -p "$OUT"
MAP=${DEVICE_MAP:-cpu:0=cpu,gpu:0=cuda:0}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  PYTHONPATH=.:docs/heuristics PYTHONUNBUFFERED=1 timeout --signal=INT "${T1:-90}" python3 \
    docs/offload_homes/step_in_backward/check.py --device-map "$MAP"
  echo "check: rc $?"
  ROUNDS=${ROUNDS:-5} PLACER="python3 -m placer" DEVICE_MAP="$MAP" timeout --signal=INT "${T2:-120}" \
    bash docs/offload_homes/step_in_backward/cpu.sh
  echo "timing: rc $?"
  PYTHONPATH=. timeout --signal=INT "${T3:-60}" python3 -m bench.host_step_call --counts 1,2,4,8,16,32,64 --repeats 200
  echo "step_call_s: rc $?"
} 2>&1 | grep --line-buffered -v "Warning\|warnings.warn\|warn(" | tee "$OUT/host-step-cuda.log"
