#!/usr/bin/env bash
# Prepared for the next lent GPU (issue 50), one call of about 7 minutes, from the repository root: llama-long
# (16 layers of Llama-3.2-1B's shape, batch 4 x 2048) on the GPU capped at 16 GiB, where neither the activations
# nor the training state fit. It measures, each row in a process of its own, until the deadline:
#   placer's plan (every layer on the GPU, most checkpointed, their weights homed on the host and copied in again
#   by each layer's second forward: the runtime of envs/real/homes.py's PHASE, never run on CUDA yet), torch's
#   FSDP2 with CPUOffloadPolicy, the same with every block checkpointed, placer's plan without checkpointing, the
#   op-only plan, FSDP2's offload as a plan, accelerate's fastest map the simulator says fits.
# Simulated (docs/offload_homes/long/table.md): placer 1.551 s, FSDP2 with every layer checkpointed 1.708 s,
# accelerate 63.8 s. Stand-in on the CPU: python -m bench.offload_homes_measure --scenario tiny --cap 0.01
# --device-map '*=cpu' --evals 30 --warmup 0 --steps 1 --out-dir /tmp/ohm
# DeepSpeed's ZeRO-Offload rows (stages 2 and 3, after FSDP2's) run where the call carries .gpu_wheels (`bash
# scripts/gpu_wheels.sh` here first; carry [".gpu_wheels"]); without them they end at once, saying it is not installed.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/gpu_out}
OUT=$OUT/long16 DEADLINE=${T1:-400} bash scripts/gpu_offload.sh homes --scenario llama-long --cap 16 --deadline 330 \
  --measure-timeout 60
echo "llama-long 16 GiB: rc $?"
