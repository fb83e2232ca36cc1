#!/usr/bin/env bash
# The GPU validation as one call of the lent GPU machine (the device tool), run in the repository root (relative
# paths are the root's):
#
#     DEADLINE=450 bash scripts/gpu_validate.sh [python -m bench.validate_gpu options...]
#
# With no options: the held-out models (gpt2, nmt-4, llama, bert) and the tuned ones (rnnlm, nmt-2, resnet50) at
# the medium size on cuda:0 and its host, 12+ placements each measured in interleaved rounds (bench/validate_gpu.py).
# Writes under $OUT (what comes back from that machine: at most 8 files) three files: log.txt (the machine, the
# software versions, bench.validate_gpu's progress and report), summary.json (every figure) and calibration.tar.gz
# (calibration/: bench.validate_gpu's <model>.jsonl and <model>.profile.json, order_trust.json, summary.json, written
# after each model, so a run stopped at the deadline keeps every model it finished; the held-out models run first).
# DEADLINE (seconds, default 450) interrupts bench.validate_gpu (which then reports the models it finished; killed 20 s
# later if it does not stop); the resumable state is under $WORK
# (default /tmp/placer_validate). Afterwards, here: `tar xzf calibration.tar.gz -C docs/`. Without a GPU,
# `bash scripts/gpu_validate.sh --tiny` runs the same pipeline on the CPU.
set -o pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-runs/gpu_out}
WORK=${WORK:-/tmp/placer_validate}
# Every measuring process starts with glibc's thread cache off, as those placer starts itself do (envs.real.allocator:
# with it on, the heap could grow by the largest host tensor at each of the first steps); a caller's tunables kept.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.tcache_count=0
mkdir -p "$OUT" "$WORK/calibration"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || echo "no nvidia-smi"
  nproc
  python3 -c "import sys, torch, numpy, numba, networkx, scipy, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'networkx', networkx.__version__, 'scipy', scipy.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available()); from envs.real.allocator import thread_cache_off; print('glibc thread cache off', thread_cache_off())"
} 2>&1 | tee "$OUT/log.txt"
PYTHONUNBUFFERED=1 timeout --signal=INT --kill-after=20 "${DEADLINE:-450}" \
  python3 -m bench.validate_gpu --out-dir "$WORK/calibration" --work-dir "$WORK/state" "$@" 2>&1 \
  | grep --line-buffered -v "FutureWarning\|return cls.__new__" | tee -a "$OUT/log.txt"
status=$?
cp "$WORK/calibration/summary.json" "$OUT/summary.json" 2>/dev/null
tar czf "$OUT/calibration.tar.gz" -C "$WORK" calibration
exit $status
