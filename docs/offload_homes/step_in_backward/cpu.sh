#!/usr/bin/env bash
# The runtime of host_step "backward" measured on this CPU. One plan, FSDP2's offload as a plan (every op on gpu:0,
# every parameter that can live apart homed on cpu:0, bench.offload_homes.fsdp2_offload_plan), run by `placer run`
# with every logical device on the CPU: gpu:0's ops on the main thread, the host worker's Adam on the other core
# (OMP_NUM_THREADS=1). Its homed parameters stepped during the backward, and the same plan with host_step "after"
# (by the optimizer's step after it); ROUNDS rounds, the two alternated, each `--steps 10 --warmup 2` (a median of
# 10 steps). From the repository root, in its venv:
#   bash docs/offload_homes/step_in_backward/cpu.sh > docs/offload_homes/step_in_backward/cpu.log
# On a GPU machine without placer installed (docs/gpu_calls/h200-next-host-step.sh):
#   PLACER="python3 -m placer" DEVICE_MAP=cpu:0=cpu,gpu:0=cuda:0 bash docs/offload_homes/step_in_backward/cpu.sh
set -euo pipefail
PLACER=${PLACER:-placer}
DEVICE_MAP=${DEVICE_MAP:-*=cpu}
ROUNDS=${ROUNDS:-7}
SOURCE=${SOURCE:-user_models:wide_mlp}
CLUSTER=${CLUSTER:-docs/offload_homes/step_in_backward/h200-cap128m.json}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export PYTHONPATH=.:docs/heuristics
if [ "$DEVICE_MAP" = "*=cpu" ]; then export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; fi  # one core per thread here
python3 - "$TMP" "$SOURCE" "$CLUSTER" <<'PY'
import sys
import envs, graphs
from graphs import sources
from bench.offload_homes import fsdp2_offload_plan
tmp, source, cluster_file = sys.argv[1:]
cluster = envs.resolve_cluster(cluster_file)
graph = sources.resolve_graph(source)
env = envs.SimEnv(graph, cluster)
for step in ("backward", "after"):
    p = fsdp2_offload_plan(graph, cluster)
    p.host_step = step
    p.save(f"{tmp}/{step}.json")
    r = env.simulate(p)
    h = r.extra.get("host_steps")  # stepped in the backward: the worker's calls and backward()'s wait, predicted
    print(f"plan {step}: {len(p.param_homes)} parameters homed ({p.homed_bytes(graph) / 2**20:.1f} MiB), "
          f"simulated on {cluster.name}: {r.step_time_s * 1e3:.3f} ms ({r.status})"
          + (f"; worker: {h['calls']} calls, waited {h['waited_s'] * 1e3:.2f} ms" if h else ""))
PY
for r in $(seq 1 "$ROUNDS"); do
  for mode in backward after; do
    s=$($PLACER run "$SOURCE" --placement "$TMP/$mode.json" --cluster "$CLUSTER" --device-map "$DEVICE_MAP" --steps 10 \
      --warmup 2 --json | python3 -c "
import json, sys
d = json.load(sys.stdin)
h = d.get('extra', {}).get('host_steps')  # stepping in the backward: what the worker did (medians)
print(d['step_time_s'], '' if not h else 'worker: %d calls, tasks %.2f ms, waited %.2f ms' % (
    h['calls'], h['worker_s'] * 1e3, h['waited_s'] * 1e3))")
    echo "round $r $mode $s"
  done
done
