#!/usr/bin/env bash
# Plans across processes on the lent machine's CPU cores (issue 48): 4 and 8 gloo ranks, one thread each, as one
# call of at most 5 minutes, run in the repository root:
#
#     bash scripts/gpu_ranks.sh                  # RANKS="4 8", the U-Net, 2 repeats of 3 timed steps
#     RANKS=2 bash scripts/gpu_ranks.sh           # the same on this machine's 2 cores (a try before the call)
#
# The U-Net by default: its stages pass only floating-point tensors, which torch 2.11 (the GPU machines') needs;
# MODELS=lm,encoder_decoder (their labels cross stages) need torch >= 2.12. For each N of RANKS:
# `placer profile $PROFILE --ranks N` (default: the U-Net) measures the N ranks into a cluster file, then
# `python -m bench.rank_splits` scores each split on that cluster with the simulator of ranks and measures each
# method's best plan on the N ranks (interleaved repeats; each measurement launches N processes, ~10 s). Writes under $OUT: log-ranks.txt (the machine, the
# software, every measurement as it is taken, the tables) and ranks.tgz (ranks-N.json: the cluster; splits-N.json:
# the report). TIMEOUT_N (seconds per N, default 150) stops one N without losing the log. Afterwards, here:
#     mkdir -p docs/ranks && tar xzf <files_at>/ranks.tgz -C docs/ranks
set -o pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-runs/gpu_out}
WORK=${WORK:-runs/ranks}
mkdir -p "$OUT" "$WORK"

{
  date -u
  nproc; free -g | head -2
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/log-ranks.txt"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1  # after nproc, which counts OMP_NUM_THREADS
status=0
for n in ${RANKS:-4 8}; do
  echo "== $n ranks" | tee -a "$OUT/log-ranks.txt"
  timeout --signal=INT --kill-after=10 "${TIMEOUT_N:-150}" bash -c "
    python3 -m placer profile ${PROFILE:-bench.rank_models:unet} --ranks $n -o $WORK/ranks-$n.json &&
    python3 -m bench.rank_splits --cluster $WORK/ranks-$n.json --models ${MODELS:-unet} --repeats ${REPEATS:-2} \
      --steps ${STEPS:-3} --warmup 1 --json > $WORK/splits-$n.json &&
    python3 -c 'import json, sys; from bench import rank_splits as r; d = json.load(open(sys.argv[1])); \
print(chr(10).join(r.table(d[\"models\"]))); print(\"fidelity\", d[\"fidelity\"])' $WORK/splits-$n.json
  " 2>&1 | grep --line-buffered -v "FutureWarning\|warnings.warn" | tee -a "$OUT/log-ranks.txt" || status=1
done
tar czf "$OUT/ranks.tgz" -C "$WORK" .
exit $status
