#!/usr/bin/env bash
# The 15 Hugging Face architectures outside the conformance corpus (docs/ranks/zb/others.py, tiny, built from
# configs), each across two CPU ranks with --check under a V plan: flops_balanced under zbv (4 stages, ranks
# 0 1 1 0, M = 2, torch's ZB-V schedule). One line per run.
set -uo pipefail
cd "$(dirname "$0")/../zb"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$PWD:$PWD/../../..${PYTHONPATH:+:$PYTHONPATH}"
T=$(mktemp -d)
for m in falcon gptj bloom starcoder2 olmo2 phi3 stablelm cohere granite bigcode gemma2 electra convnext swin whisper; do
  placer place others:$m --cluster k80x2 --method flops_balanced --option microbatches=2 --option schedule=zbv \
      --ranks -o $T/zbv.json > /dev/null
  line=$(placer run others:$m --placement $T/zbv.json --cluster k80x2 --nproc-per-node 2 --check --steps 3 2>&1 \
      | grep -E '^check|error' | tail -1)
  echo "$m zbv (stage cut at $(python -c "import json,sys; print(json.load(open(sys.argv[1]))['stage_cuts'])" $T/zbv.json)): $line"
done
rm -rf "$T"
