#!/bin/bash
# The runs of docs/critic_target (from the repository root): bash docs/critic_target/run_modes.sh GRAPHS EVALS SEEDS MODE...
# usage: run_modes.sh GRAPHS EVALS SEEDS MODE...
cd "$(dirname "$0")/../.." && . .venv/bin/activate && export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_DISABLE_USAGE_STATS=1
G=$1; E=$2; S=$3; shift 3
for m in "$@"; do
  meth=learned; [ "$m" = uniform ] && meth=uniform
  tag=$(echo $G | tr ',' '_')-$E-$m
  PYTHONPATH=.:docs/critic_target TARGET=${m/uniform/faster} python docs/critic_target/patch_target.py --graphs $G --clusters k80x4 --evals $E --seconds "" --methods $meth --seeds $S --json > docs/critic_target/r-$tag.json 2>docs/critic_target/r-$tag.err
done
