#!/usr/bin/env bash
# The measured loop (--algo corrected) against its ablations on the offload scenario, as one call of a lent GPU
# machine (at most 8 minutes), run in the repository root:
#
#     bash scripts/gpu_correction.sh                          # llama-256k on cuda:0 capped at 24 GiB, 5 measurements
#     SCENARIO=tiny DEVICE_MAP='*=cpu' bash scripts/gpu_correction.sh --measurements 6   # the CPU stand-in (a test)
#
# A measurement of llama-256k takes 13-16 s on an H100 (a build and 4 steps of ~2.3 s), so the 8 minutes hold about
# 25 of them: 5 per method and 2 side-by-side rounds of all four.
#
# Each method (the simulator's best, measured moves, simulator rank, corrected; bench/correction.py) gets the same
# measurements, then every method's placement and the simulator's best are re-measured side by side. Writes under
# $OUT: log-correction.txt (the machine, the software, progress, the table) and correction.json (every run with its
# curves: real step against measurements, the simulator's prediction, the correction's), and correction-run/
# measurements.jsonl (each measurement as it arrives). DEADLINE (seconds, default 450) interrupts the run before the
# 8-minute mark; the JSON then has the methods that finished ("interrupted": true). Afterwards, here:
# cp <files_at>/correction.json docs/correction/
set -o pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-runs/gpu_out}
# The caching allocator grows segments in place instead of cutting new ones, so the reserve a cap limits stays near
# the allocated bytes the simulator models: on an H200 at 24 GiB the homed plan of llama-256k failed with 19.70 GiB
# allocated and 2.55 GiB reserved unused, asking for 1.95 GiB (docs/offload_homes/h200/measured-llama-256k-24.json).
# A caller's own setting wins (PYTORCH_CUDA_ALLOC_CONF= measures without it).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
# Every measuring process starts with glibc's thread cache off, as those placer starts itself do (envs.real.allocator:
# with it on, the heap could grow by the largest host tensor at each of the first steps); a caller's tunables kept.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.tcache_count=0
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  nproc; free -g | head -2
  python3 -c "import os, sys, torch; print('alloc_conf', repr(os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''))); print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available()); from envs.real.allocator import thread_cache_off; print('glibc thread cache off', thread_cache_off())"
} 2>&1 | tee "$OUT/log-correction.txt"
PYTHONUNBUFFERED=1 timeout --signal=INT "${DEADLINE:-450}" \
  python3 -m bench.correction local --scenario "${SCENARIO:-llama-256k}" \
  --device-map "${DEVICE_MAP:-cpu:0=cpu,gpu:0=cuda:0}" --warmup 1 --steps 3 --measure-timeout 60 \
  --out-dir "$OUT/correction-run" --measurements 5 --rematch 2 --json "$@" 2> >(tee -a "$OUT/log-correction.txt" >&2) > "$OUT/correction.json"
status=$?
python3 -c "import json, sys; from bench.correction import markdown_table; print(markdown_table(json.load(open(sys.argv[1]))['cells']))" "$OUT/correction.json" 2>&1 | tee -a "$OUT/log-correction.txt"
exit $status
