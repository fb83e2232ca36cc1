"""The stages' shapes of a plan: the chain of stages run on fake tensors, against reading them from one kept run
of the whole program (envs.real.distributed.stage_modules.cached_program_values). CPU seconds of this process, the
median of 3 (a fresh unlifted module each time, as a job of a measured env has).

    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/stage_shapes/kept_run.py
"""

import time

import torch

from bench.dist_conformance import plan_of
from envs.real.distributed import stage_modules as sm
from envs.real.distributed.rank_plan import compile_plan
from envs.real.pipeline import split_batch
from graphs.models.corpus import build_causal
from graphs.torch_capture import export_program, graph_from_program

torch.manual_seed(0)
for name, layers in [("gpt2", 12), ("llama", 16)]:
    key = "n_layer" if name == "gpt2" else "num_hidden_layers"
    model, inputs = build_causal(name, batch=8, seq=64, **{key: layers})
    mb = split_batch(inputs, 2)[0]
    prog = export_program(model, mb, stack_traces=False)
    part = graph_from_program(prog)
    for kind in ["split", "zbv"]:
        plan = compile_plan(part, plan_of(kind, part), program=part)
        chain = []
        fast = []
        for rep in range(3):
            gm = prog.module()
            mods = sm.stage_programs(gm, [s.ops for s in plan.stages], split_backward=kind == "zbv")
            t = time.process_time()
            sm.stage_shapes(mods, mb)
            chain.append(time.process_time() - t)
            t = time.process_time()
            sm.stage_shapes(mods, mb, sm.cached_program_values(prog, gm, mb))
            fast.append(time.process_time() - t)
        print(
            f"{name}-{layers} ({part.num_ops} ops) {kind}: chain {sorted(chain)[1]:.3f} s; "
            f"from the kept run {sorted(fast)[1]:.4f} s (first, with the run: {fast[0]:.3f} s)"
        )
