#!/usr/bin/env bash
# The GPU validation as one call of the lent GPU machine (the device tool), from the repository root:
#
#     bash scripts/gpu_validate.sh [validate_gpu.py options...]
#
# Writes under $OUT (what comes back from that machine: at most 8 files): log.txt (the machine, the
# software versions, validate_gpu.py's progress and report) and calibration/ (validate_gpu.py's
# <model>.jsonl, <model>.profile.json and summary.json, written after each model, so a run stopped at
# the deadline keeps every model it finished). DEADLINE (seconds, default 560) stops validate_gpu.py
# before the call's 10-minute limit. Copy calibration/* into docs/calibration/ afterwards.
set -o pipefail
OUT=${OUT:-runs/gpu_out}
mkdir -p "$OUT/calibration"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nproc
  python3 -c "import sys, torch, numpy, numba, networkx, scipy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'networkx', networkx.__version__, 'scipy', scipy.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/log.txt"
PYTHONUNBUFFERED=1 PYTHONPATH=. timeout --signal=INT "${DEADLINE:-560}" \
  python3 scripts/validate_gpu.py --out-dir "$OUT/calibration" "$@" 2>&1 | grep --line-buffered -v "FutureWarning\|return cls.__new__" | tee -a "$OUT/log.txt"
