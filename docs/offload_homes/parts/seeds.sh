#!/usr/bin/env bash
# `placer place --method homes` on user_models:nn_transformer at 96, 64 and 48 MiB, seeds 0-4, with the code of
# commit BEFORE (a worktree in $TMP/before) and of this checkout, then every BEFORE plan simulated by this checkout.
# From the repository root, in its venv:  bash docs/offload_homes/parts/seeds.sh 9630e86 > docs/offload_homes/parts/seeds.log
set -euo pipefail
BEFORE=${1:?usage: seeds.sh BEFORE_COMMIT}
ROOT=$(pwd)
TMP=$(mktemp -d)
git worktree add -q --detach "$TMP/before" "$BEFORE"
trap 'git worktree remove --force "$TMP/before"; rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
place() {  # tree cap seed label (run from the tree: python -c puts the working directory first on its path)
  cd "$1" && PYTHONPATH="$1:$1/docs/heuristics" python -c "import sys; from placer.cli import console_main; sys.argv[0] = 'placer'; sys.exit(console_main())" \
    place user_models:nn_transformer --cluster "$ROOT/docs/offload_homes/branching/h200-cap$2m.json" --method homes \
    --seed "$3" -o "$TMP/$4-$2-$3.json" 2>/dev/null | head -2 | tr '\n' ' '
  echo
}
for c in 96 64 48; do
  for s in 0 1 2 3 4; do
    echo "before cap=${c}m seed=$s $(place "$TMP/before" $c $s before)"
    echo "after cap=${c}m seed=$s $(place "$ROOT" $c $s after)"
    cd "$ROOT"
    echo "before's plan, simulated after: cap=${c}m seed=$s $(PYTHONPATH=docs/heuristics placer simulate \
      user_models:nn_transformer "$TMP/before-$c-$s.json" --cluster docs/offload_homes/branching/h200-cap${c}m.json \
      2>/dev/null | grep 'step time' | tr -s ' ')"
  done
done
