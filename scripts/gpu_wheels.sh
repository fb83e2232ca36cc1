#!/usr/bin/env bash
# Wheels for a lent GPU machine, which cannot reach the internet: DeepSpeed, and what it needs beyond what that
# machine has (torch, numpy, packaging, tqdm), for the offload scenario's DeepSpeed rows
# (bench/deepspeed_offload.py). Run here, where the package index is reachable; the folder travels with the call
# and scripts/gpu_offload.sh unpacks it there:
#
#     bash scripts/gpu_wheels.sh                     # writes .gpu_wheels/ (ignored by git), about 8 MB
#     device run: command "DEADLINE=300 bash scripts/gpu_offload.sh homes --scenario llama-256k --cap 16 ...",
#                 carry [".gpu_wheels"]
#
# PY (default 3.12) is the machine's Python (its log's first lines say which). DeepSpeed's wheel is pure Python:
# its compiled ops (the CPU Adam) are built where they first run, and where that fails the rows say so and use
# torch's Adam.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-.gpu_wheels}
PY=${PY:-3.12}
DEEPSPEED=${DEEPSPEED:-deepspeed==0.19.8}
rm -rf "$DIR" && mkdir -p "$DIR"
# DeepSpeed's own wheel, built from its source here (no ops compiled into it); its dependencies below, not torch
DS_BUILD_OPS=0 python -m pip wheel -q --no-deps -w "$DIR" "$DEEPSPEED"
# the rest as binary wheels for the machine's Python on x86-64 Linux, with their own dependencies (none needs torch)
python -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$DIR" \
  hjson ninja py-cpuinfo msgpack einops pydantic psutil
ls "$DIR"
du -sh "$DIR"
