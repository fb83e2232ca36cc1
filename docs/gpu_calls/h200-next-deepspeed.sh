#!/usr/bin/env bash
# Prepared for the next lent GPU (issue 50), one call of at most 8 minutes, from the repository root: DeepSpeed's
# ZeRO-Offload beside placer's plan with homes and torch's FSDP2, llama-256k on the GPU capped at 16 GiB
# (`--rows rivals`: placer's homed plan, FSDP2 with CPUOffloadPolicy, the same with every block checkpointed,
# DeepSpeed ZeRO-2 with Adam and gradients on the host, ZeRO-3 with the parameters there too; each row in a process
# of its own). The machine has no package index: first, here,
#
#     bash scripts/gpu_wheels.sh          # .gpu_wheels/, about 6 MB
#
# then the device call: command "bash docs/gpu_calls/h200-next-deepspeed.sh", carry [".gpu_wheels"]. DeepSpeed's CPU
# Adam is compiled at its first row (about a minute); where it does not build, the rows run torch's and say why.
# Stand-in on the CPU: python -m bench.offload_homes_measure --scenario tiny --cap 0.01 --device-map '*=cpu'
# --evals 30 --warmup 0 --steps 1 --rows rivals --out-dir /tmp/ohm
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
OUT=$OUT/deepspeed16 DEADLINE=${T1:-440} bash scripts/gpu_offload.sh homes --scenario llama-256k --cap 16 \
  --deadline 370 --measure-timeout 90 --rows rivals
echo "llama-256k 16 GiB, rivals: rc $?"
