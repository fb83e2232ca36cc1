#!/usr/bin/env bash
# One stage of the offload scenario (bench/gpu_offload.py) as one call of a lent GPU machine, run in the repository
# root (relative paths are the root's):
#
#     bash scripts/gpu_offload.sh profile  [options...]    # about 2 minutes (estimated): the calibration
#     bash scripts/gpu_offload.sh rivals   [options...]    # about 6 minutes on one H100
#     bash scripts/gpu_offload.sh finetune [options...]    # about 5 minutes
#     bash scripts/gpu_offload.sh homes --scenario llama-256k --cap 8   # one model at one cap (24, 16, 8; llama-3b
#                                                                      # too): plans with parameter homes, measured
#
# DeepSpeed's rows (homes) need DeepSpeed there: `bash scripts/gpu_wheels.sh` here first, and carry .gpu_wheels.
#
# The stage works in runs/offload, started from docs/offload when the checkout has it (what earlier calls
# measured: their measurements are read back, not taken again). Writes under $OUT (at most 8 files come
# back from that machine): log-<stage>.txt (the machine, the software, the stage's progress and table) and
# offload.tgz (runs/offload without TensorBoard events). DEADLINE (seconds, default 450) interrupts the stage
# before the 8-minute mark; every measurement taken is in the log by then. Afterwards, here:
#
#     rm -rf docs/offload && tar xzf <files_at>/offload.tgz -C docs/ && python -m bench.gpu_offload report --out-dir docs/offload
set -o pipefail
STAGE=${1:?usage: bash scripts/gpu_offload.sh profile|rivals|finetune|homes [options]}
shift
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-runs/gpu_out}
# The caching allocator grows segments in place instead of cutting new ones, so the reserve a cap limits stays near
# the allocated bytes the simulator models: on an H200 at 24 GiB the homed plan of llama-256k failed with 19.70 GiB
# allocated and 2.55 GiB reserved unused, asking for 1.95 GiB (docs/offload_homes/h200/measured-llama-256k-24.json).
# The rows' processes inherit it; a caller's own setting wins (PYTORCH_CUDA_ALLOC_CONF= measures without it).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
# Every measuring process starts with glibc's thread cache off, as those placer starts itself do (envs.real.allocator:
# with it on, the heap could grow by the largest host tensor at each of the first steps); a caller's tunables kept.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.tcache_count=0
mkdir -p "$OUT" runs
# DeepSpeed for its rows, from the wheels scripts/gpu_wheels.sh made here and the call carried (`carry`: .gpu_wheels):
# the machine cannot reach the package index. Without them the DeepSpeed rows say that it is not installed.
if [ -d .gpu_wheels ]; then
  python3 -m pip install -q --no-deps --no-index --target .gpu_site .gpu_wheels/*.whl 2>&1 | grep -v "as the 'root' user"
  [ -d .gpu_site/deepspeed ] || python3 scripts/unpack_wheels.py .gpu_wheels .gpu_site  # no pip there
  export PYTHONPATH="$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}" PATH="$PWD/.gpu_site/bin:$PATH"
fi
if [ -d docs/offload ] && [ ! -e runs/offload ]; then cp -r docs/offload runs/offload; fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2
  python3 -c "import os, sys, torch, transformers, accelerate; print('alloc_conf', repr(os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''))); print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'cuda', torch.cuda.is_available()); from envs.real.allocator import thread_cache_off; print('glibc thread cache off', thread_cache_off())"
  python3 -c "import importlib.metadata as m; print('deepspeed', m.version('deepspeed'))" 2>/dev/null || echo "deepspeed: not installed (bash scripts/gpu_wheels.sh here, then carry .gpu_wheels)"
} 2>&1 | tee "$OUT/log-$STAGE.txt"
if [ "$STAGE" = homes ]; then  # bench/offload_homes_measure.py: its rows under runs/offload_homes, then offload_homes.tgz
  PYTHONUNBUFFERED=1 timeout --signal=INT "${DEADLINE:-450}" \
    python3 -m bench.offload_homes_measure --out-dir runs/offload_homes --deadline 360 "$@" 2>&1 | grep --line-buffered -v "FutureWarning\|warnings.warn" | tee -a "$OUT/log-$STAGE.txt"
  status=$?
  tar czf "$OUT/offload_homes.tgz" -C runs offload_homes
  exit $status
fi
PYTHONUNBUFFERED=1 timeout --signal=INT "${DEADLINE:-450}" \
  python3 -m bench.gpu_offload "$STAGE" --out-dir runs/offload "$@" 2>&1 | grep --line-buffered -v "FutureWarning\|warnings.warn" | tee -a "$OUT/log-$STAGE.txt"
status=$?
tar czf "$OUT/offload.tgz" --exclude='events.out.tfevents*' --exclude=train.lock -C runs offload
exit $status
