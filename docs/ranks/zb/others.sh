#!/usr/bin/env bash
# 15 Hugging Face architectures outside the conformance corpus (docs/ranks/zb/others.py, tiny, built from configs),
# each across two CPU ranks with --check under three plans: equal_layers (2 stages, GPipe), flops_balanced looped
# (4 stages, M = 2, torch's LoopedBFS) and the same looped plan under interleaved_zb. One line per run.
# Names given run those instead (any of others.py's, its NEWER too): `bash others.sh modernbert gemma3 > newer.log`;
# a name with a colon is a source of its own: `bash others.sh diffusion:unet2d diffusion:flux` (docs/ranks/zb/diffusion.py).
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$PWD:$PWD/../../..${PYTHONPATH:+:$PYTHONPATH}"
T=$(mktemp -d)
MODELS=(falcon gptj bloom starcoder2 olmo2 phi3 stablelm cohere granite bigcode gemma2 electra convnext swin whisper)
[ $# -gt 0 ] && MODELS=("$@")
for name in "${MODELS[@]}"; do
  case $name in *:*) m=$name ;; *) m=others:$name ;; esac
  placer place $m --cluster k80x2 --method equal_layers --option microbatches=2 --ranks -o $T/split.json > /dev/null
  placer place $m --cluster k80x2 --method flops_balanced --option stages_per_rank=2 --option microbatches=2 \
      --ranks -o $T/looped.json > /dev/null
  placer place $m --cluster k80x2 --method flops_balanced --option stages_per_rank=2 --option microbatches=2 \
      --option schedule=interleaved_zb --ranks -o $T/zb.json > /dev/null
  for plan in split looped zb; do
    line=$(placer run $m --placement $T/$plan.json --cluster k80x2 --nproc-per-node 2 --check --steps 3 2>&1 \
        | grep -E '^check|error' | tail -1)
    echo "$name $plan: $line"
  done
done
rm -rf "$T"
