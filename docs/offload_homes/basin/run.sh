#!/usr/bin/env bash
# Every cell of the offload scenario at 20,000 placements, seeds 0-2, with PROPOSALS (critic or uniform), appended
# to OUT as JSON lines (BENCHMARKS.md, "The homed start's basin"). From the repository root:
#     bash docs/offload_homes/basin/run.sh critic docs/offload_homes/basin/after-20k.jsonl
PROPOSALS=${1:-critic}
OUT=${2:?usage: run.sh critic|uniform OUT}
for seed in 0 1 2; do
  for cell in llama-256k:24 llama-256k:16 llama-256k:8 llama-3b:24 llama-3b:16 llama-3b:8; do
    PYTHONPATH=. python docs/offload_homes/basin/pwh.py "${cell%:*}" "${cell#*:}" 20000 "$seed" "$PROPOSALS" >> "$OUT"
  done
done
