"""The conformance corpus across processes: every model, split and looped over two ranks on two nodes, float64's
loss and gradients.

One launch checks the whole corpus (:mod:`bench.dist_conformance`): two launchers on
this machine, one process each, meet at a rendezvous (2 nodes x 1 rank), and the two
processes loop over the models, each under a split over the two ranks (torch's GPipe,
2 microbatches), a looped plan (2 stages per rank, 1 microbatch in flight: placer's
issue order as torch's action list), the looped plan's stages under torch's
interleaved zero-bubble schedule (each backward split into its input and weight parts), and the same blocks
in a V (ranks 0 1 1 0) under torch's ZB-V schedule.
Rank 0 compares each step with the float64 one-process step at the conformance tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import dist_conformance
from envs.real.distributed.launch import free_port
from graphs.models import corpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_corpus_model_keeps_its_gradients_across_two_nodes():
    names = corpus.available()
    endpoint = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen(
        [sys.executable, "-m", "bench.dist_conformance", "--nnodes", "2", "--node-rank", "1"]
        + ["--rdzv-endpoint", endpoint],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rows = dist_conformance.run(names, nnodes=2, node_rank=0, rdzv_endpoint=endpoint)
        _, err = node1.communicate(timeout=120)
    finally:
        node1.kill()
    assert node1.returncode == 0, err[-2000:]
    assert [(r["model"], r["plan"]) for r in rows] == [(n, p) for n in names for p in dist_conformance.PLANS]
    assert {r["schedule"] for r in rows if r["ok"]} == {"gpipe", "planned", "interleaved_zb", "zbv"}
    bad = [f"{r['model']}/{r['plan']}: {r.get('message') or r['worst']} at {r.get('worst_ratio')}" for r in rows]
    assert all(r["ok"] for r in rows), "; ".join(b for b, r in zip(bad, rows) if not r["ok"])
