#!/usr/bin/env bash
# The lent H200's second call of the session of 2026-11-29 (issue 50): rows the first call's deadline left, and
# placer's plan with homes again beside them, each row a process of its own (bench.offload_homes_measure --row),
# from the plans the first call made on that machine (docs/offload_homes/h200/2026-11-29/measured-*.json).
# Stand-in on the CPU: SCENARIO=tiny DIR=runs/offload_homes DEVICE_MAP='*=cpu' ROWS="0.01|..." OUT=/tmp/g bash <this file>
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
SCENARIO=${SCENARIO:-llama-256k}
DIR=${DIR:-docs/offload_homes/h200/2026-11-29}
DEVICE_MAP=${DEVICE_MAP:-cpu:0=cpu,gpu:0=cuda:0}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True} PYTHONUNBUFFERED=1
ROWS=${ROWS:-"16|placer, move search with homes
16|accelerate, max_memory = 0.25 x the cap
8|placer, move search with homes
8|accelerate, max_memory = 0.5 x the cap
8|FSDP2 CPUOffloadPolicy as planned (all on gpu:0, every parameter homed on cpu:0)"}
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null; echo "alloc_conf $PYTORCH_CUDA_ALLOC_CONF"; } | tee "$OUT/log-rows.txt"
while IFS='|' read -r cap label; do
  t0=$(date +%s)
  line=$(python3 -m bench.offload_homes_measure --row "$label" --out-dir "$DIR" --scenario "$SCENARIO" --cap "$cap" \
    --device-map "$DEVICE_MAP" --warmup 1 --steps 3 --measure-timeout 100 2>>"$OUT/stderr-rows.txt" | tail -1)
  echo "{\"cap_gib\": $cap, \"label\": \"$label\", \"seconds\": $(( $(date +%s) - t0 )), \"result\": ${line:-null}}" | tee -a "$OUT/rows.jsonl"
done <<<"$ROWS"
