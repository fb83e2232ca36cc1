"""``placer train --ranks``: a run that learns plans across processes, scored as ``placer run --nproc-per-node`` runs
them (the simulator of ranks, or one job of processes per placement), and keeps a plan that command runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
from envs.sim.ranks import RankSim
from graphs import OpGraph, save
from graphs.plan import Placement
from placer.cli import main
from placer.learn.run_scorers import measured_env
from placer.learn.rundir import save_best
from placer.learn.runners import train
from placer.learn.stand_in import StandIn
from tests.placer.learn.tiny_runs import train_config

SPLITS = ("equal_layers", "flops_balanced", "stage_search")


def uneven_chain(n: int = 6) -> OpGraph:
    """A chain of ``n`` layers of uneven work (1x, 2x, 3x), two ops each (a matmul and its activation), with module
    paths, so that the pipeline splits and module_search apply."""
    names = [f"layers.{k}.{op}" for k in range(n) for op in ("mm", "act")]
    return OpGraph.from_edges(
        names,
        [(a, b, 4_000_000) for a, b in zip(names, names[1:])],
        flops=[2e9 * (1 + k % 3) if op == "mm" else 1e6 for k in range(n) for op in ("mm", "act")],
        module_paths=[f"layers.{k}" for k in range(n) for _ in range(2)],
        param_bytes=[4_000_000 if op == "mm" else 0 for k in range(n) for op in ("mm", "act")],
        name="uneven-chain",
    )


def test_a_run_across_processes_scores_on_the_simulator_of_ranks_and_keeps_a_plan_run_can_run(tmp_path):
    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    config = train_config(tmp_path, ranks=True, microbatches=2, algo="moves", iterations=8, heuristics=SPLITS)
    result = train(config, graph=g, cluster=cluster)
    ranks, one_process = RankSim(g, cluster, microbatches=2), envs.SimEnv(g, cluster, microbatches=2)

    best = Placement.load(str(tmp_path / "run" / "best_placement.json"))
    assert best.meta["ranks"] is True and best.microbatches == 2 and best.order is None  # node order: the stages
    # the time the run recorded is the simulator of ranks' time of the plan in the file, not the one process's
    assert result.best_step_time_s == pytest.approx(ranks.simulate(best).step_time_s, rel=1e-12)
    assert abs(one_process.simulate(best).step_time_s - result.best_step_time_s) > 1e-3 * result.best_step_time_s
    # the bound is that of ranks at the run's M (the one-process bound does not hold across processes), with the fill
    # of one stage per rank, the plans the run scores (above all its compute spread over the ranks, here)
    bound = RankSim(g, cluster, microbatches=2, one_stage_per_rank=True).lower_bound()
    assert result.lower_bound_s == float(bound) and bound.name == "pipeline fill, one stage per rank"
    assert float(ranks.lower_bound()) < result.lower_bound_s <= result.best_step_time_s
    # the splits people use, scored across processes too: the learned plan is never slower than the best of them
    assert set(result.heuristics) == set(SPLITS)
    for name, step_time_s in result.heuristics.items():
        assert np.isfinite(step_time_s), name
    assert result.best_step_time_s <= min(result.heuristics.values()) * (1 + 1e-12)
    # the equal-budget search searched the simulator of ranks, every placement counted
    eq = result.equal_budget_search
    assert eq is not None and eq["simulated"] > 0 and eq["step_time_s"] is not None
    assert eq["step_time_s"] >= result.best_step_time_s * (1 - 1e-12) or "placement" in eq


def test_the_schedule_asked_for_is_the_one_every_plan_is_scored_and_written_with(tmp_path):
    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    config = train_config(
        tmp_path, ranks=True, microbatches=4, schedule="1f1b", algo="moves", iterations=3, heuristics=SPLITS[:2]
    )
    result = train(config, graph=g, cluster=cluster, env=RankSim(g, cluster, microbatches=4, schedule="1f1b"))
    best = result.best_placement
    assert best.schedule == "1f1b" and best.microbatches == 4
    scored = RankSim(g, cluster).simulate(best)
    assert scored.extra["schedule"] == "1f1b" and scored.step_time_s == pytest.approx(result.best_step_time_s)


def test_a_run_that_chooses_its_shape_takes_the_fastest_splits_and_keeps_it(tmp_path, capsys):
    from envs.sim.ranks import PIPELINE_SHAPES
    from placer.learn.shapes import SPLITS as SHAPE_SPLITS

    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    config = train_config(tmp_path, ranks=True, choose_shape=True, algo="moves", iterations=4, heuristics=SPLITS)
    result = train(config, graph=g, cluster=cluster)
    choice = json.loads((tmp_path / "run" / "shapes.json").read_text())
    rows = choice["rows"]
    assert [(r["microbatches"], r["inflight"] or r["microbatches"]) for r in rows] == list(PIPELINE_SHAPES)
    fastest = min(rows, key=lambda r: r["step_time_s"])
    assert (choice["microbatches"], choice["inflight"]) == (fastest["microbatches"], fastest["inflight"])
    assert choice["microbatches"] > 1 and fastest["method"] in SHAPE_SPLITS  # the chain gains from microbatches
    assert choice["simulated"] > len(PIPELINE_SHAPES)  # stage_search's placements, at every shape
    # every split at each shape, scored alone: each shape's row is the fastest of them
    from placer.methods import registry

    for r in rows:
        sim = RankSim(g, cluster, microbatches=r["microbatches"], inflight=r["inflight"])
        shape = {"microbatches": r["microbatches"], "inflight": r["inflight"]}
        alone = [sim.simulate(registry.place(m, g, cluster, **shape)).step_time_s for m in SHAPE_SPLITS]
        assert r["step_time_s"] == pytest.approx(min(alone), rel=1e-9)
    M, W = fastest["microbatches"], fastest["inflight"]
    # the run took that shape: its plan, its file and the time it recorded
    best = Placement.load(str(tmp_path / "run" / "best_placement.json"))
    assert (best.microbatches, best.inflight) == (M, W) and result.best_placement.microbatches == M
    assert result.best_step_time_s == pytest.approx(RankSim(g, cluster).simulate(best).step_time_s, rel=1e-12)
    assert result.best_step_time_s <= fastest["step_time_s"] * (1 + 1e-12)
    # the choice's placements are counted with the heuristics' (the equal-budget search is given them)
    assert result.equal_budget_search["heuristics_simulated"] >= choice["simulated"]
    # the command line says it chose, and the JSON has every shape
    path = str(tmp_path / "g.json")
    save(g, path)
    argv = ["train", path, "--cluster", "k80x2", "--ranks", "--choose-shape", "--iterations", "2", "--no-progress"]
    argv += ["--heuristics", ",".join(SPLITS), "--logdir", str(tmp_path / "cli")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"over {M} microbatches (chosen of {len(PIPELINE_SHAPES)} shapes)" in out


def test_a_measured_run_across_processes_measures_its_heuristics_and_keeps_the_fastest_measured(tmp_path):
    """Under --env measured the heuristics and the learner's plans are measured (here a stand-in reality: the
    simulator of ranks on a cluster whose gpu:1 is 3x slower than the file says), the search reads the simulator of
    ranks, and the best is what was measured."""
    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    real = StandIn(g, cluster, slow_device="gpu:1", slowdown=3.0, simulator=lambda g, c: RankSim(g, c, microbatches=2))
    config = train_config(
        tmp_path,
        env="measured",
        ranks=True,
        microbatches=2,
        algo="moves",
        iterations=3,
        heuristics=SPLITS,
        measure_heuristics=2,
        rematch=1,
    )
    result = train(config, graph=g, cluster=cluster, env=real)
    assert len(result.measured_heuristics) >= 2 and result.rematch is not None
    best = result.best_placement
    assert best.meta["ranks"] is True and best.meta["env"] == "measured"
    truth, _ = real.true_step_times(best.indices(g, cluster.device_names)[None])
    assert result.best_step_time_s == pytest.approx(float(truth[0]))
    assert result.best_step_time_s <= min(result.measured_heuristics.values()) * (1 + 1e-12)


def test_the_measured_scorer_across_processes_is_a_job_of_ranks_with_the_runs_plan(tmp_path):
    from envs.real.ray.jobs import RanksEnv

    config = train_config(
        tmp_path, source="bench.rank_models:lm", env="measured", ranks=True, microbatches=4, schedule="gpipe"
    )
    g = uneven_chain()
    env = measured_env(config, g, envs.resolve_cluster("k80x2"), str(tmp_path))
    try:  # nothing is started until a placement is measured
        assert isinstance(env, RanksEnv) and env.backend == "gloo"
        assert env.plan_options == {"microbatches": 4, "inflight": None, "schedule": "gpipe"}
    finally:
        env.close()


def test_a_plan_across_processes_never_stands_against_a_one_process_file(tmp_path):
    g, devices = uneven_chain(), ["cpu:0", "gpu:0", "gpu:1"]
    path = str(tmp_path / "best.json")
    fast = Placement.from_indices(g, devices, [1] * 12, cluster="k80x2", meta={"step_time_s": 0.1, "env": "sim"})
    assert save_best(path, fast)
    slower = Placement.from_indices(
        g, devices, [1] * 6 + [2] * 6, cluster="k80x2", meta={"step_time_s": 0.2, "env": "sim", "ranks": True}
    )
    assert save_best(path, slower)  # another problem: its time is not comparable, the file is the new run's
    assert Placement.load(path).meta["ranks"] is True


def test_a_resumed_run_adopts_a_newer_best_only_from_its_own_kind_of_run(tmp_path):
    from placer.learn.run_scorers import CachedScorer
    from placer.learn.rundir import BEST_NAME, adopt_newer_best
    from placer.learn.state import RunState

    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    devices = list(cluster.device_names)
    plan = [1] * 6 + [2] * 6
    meta = {"step_time_s": 0.1, "env": "sim", "ranks": True, "found_by": "move search"}
    Placement.from_indices(g, devices, plan, cluster="k80x2", meta=meta).save(str(tmp_path / BEST_NAME))
    score = CachedScorer(RankSim(g, cluster))
    one_process = RunState()
    adopt_newer_best(one_process, str(tmp_path), g, devices, score, train_config(tmp_path))
    assert one_process.best_indices is None  # a plan across processes says nothing of a one-process run
    across = RunState()
    adopt_newer_best(across, str(tmp_path), g, devices, score, train_config(tmp_path, ranks=True))
    assert across.best_indices == plan and across.best_found_by == "move search"
    unknown = RunState()
    adopt_newer_best(unknown, str(tmp_path), g, devices, score)  # no config: nothing to tell the kinds apart by
    assert unknown.best_indices == plan


def test_the_command_line_prints_the_plan_and_the_command_that_runs_it(tmp_path, capsys):
    path = str(tmp_path / "g.json")
    save(uneven_chain(), path)
    argv = ["train", path, "--cluster", "k80x2", "--ranks", "--microbatches", "2", "--iterations", "2"]
    argv += ["--heuristics", ",".join(SPLITS), "--no-progress", "--logdir"]
    assert main([*argv, str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "across processes 2 ranks" in out and "--nproc-per-node 2" in out and "lower bound" in out
    assert main([*argv, str(tmp_path / "b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"]["ranks"] == 2 and doc["ranks"]["microbatches"] == 2
    assert doc["lower_bound_s"] == float(
        RankSim(uneven_chain(), envs.resolve_cluster("k80x2"), microbatches=2, one_stage_per_rank=True).lower_bound()
    )
    assert doc["ranks"]["run_command"].endswith(
        f"--placement {tmp_path / 'b' / 'best_placement.json'} --cluster k80x2 --nproc-per-node 2"
    )


def test_a_looped_run_without_per_op_times_says_the_roofline_alone_times_its_plans(tmp_path, capsys):
    path = str(tmp_path / "g.json")
    save(uneven_chain(), path)
    argv = ["train", path, "--cluster", "k80x2", "--ranks", "--microbatches", "2", "--iterations", "1"]
    argv += ["--heuristics", "equal_layers", "--no-progress", "--logdir"]
    assert main([*argv, str(tmp_path / "a"), "--looped"]) == 0
    err = capsys.readouterr().err
    assert "note: plans of more stages than ranks are timed by the roofline alone" in err and "--profile" in err
    assert main([*argv, str(tmp_path / "b")]) == 0  # one stage per rank: no line
    assert "roofline alone" not in capsys.readouterr().err
    g = uneven_chain()  # per-op times given: no line
    prof = {"format": "placer-profile/1", "graph_hash": g.content_hash, "ops": list(g.names), "links": []}
    prof["devices"] = {"cpu": {"kind": "cpu", "fwd_s": [1e-3] * g.num_ops, "bwd_s": [2e-3] * g.num_ops}}
    (tmp_path / "prof.json").write_text(json.dumps(prof))
    assert main([*argv, str(tmp_path / "c"), "--looped", "--profile", str(tmp_path / "prof.json")]) == 0
    assert "roofline alone" not in capsys.readouterr().err


def test_a_best_plan_on_one_rank_is_run_across_one_process(tmp_path):
    """A plan whose stages merged into one (the measured loops' merges, ``stage_search --option merge=true``): the
    summary counts one rank and one stage, and its command starts one process."""
    from placer.cli.train import ranks_doc, ranks_line

    g, cluster = uneven_chain(), envs.resolve_cluster("k80x2")
    path = str(tmp_path / "best.json")
    config = train_config(tmp_path, ranks=True, source="m:build", cluster="k80x2")
    best = Placement.from_indices(g, list(cluster.device_names), [1] * 12, cluster="k80x2")
    doc = ranks_doc(config, best, path, g, cluster)
    assert doc["ranks"] == 1 and doc["stages"] == 1
    assert doc["run_command"] == f"placer run m:build --placement {path} --cluster k80x2 --nproc-per-node 1"
    line = ranks_line({"ranks": doc})
    assert line.startswith("across processes 1 rank, 1 stage, ") and "--nproc-per-node 1" in line
    two = ranks_doc(config, Placement.from_indices(g, list(cluster.device_names), [1] * 6 + [2] * 6), path, g, cluster)
    assert ranks_line({"ranks": two}).startswith("across processes 2 ranks, 2 stages, ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--schedule", "1f1b"], "--schedule 1f1b: only for plans across processes (add --ranks)"),
        (["--backend", "nccl"], "--backend nccl: only for plans across processes"),
        (["--ranks", "--score-order", "planned"], "--score-order planned: not across processes"),
        (["--ranks", "--executor", "dataflow"], "--executor dataflow"),
        (["--ranks", "--backend", "nccl"], "--backend nccl: only measured runs"),
        (["--ranks", "--schedule", "dualpipe"], "--schedule: 'dualpipe' is not a schedule"),
        (["--ranks", "--schedule", "dualpipev"], "--schedule dualpipev: its V puts two consecutive stages on one rank"),
        (["--ranks", "--schedule", "zbv"], "--schedule zbv: its V puts two consecutive stages on one rank"),
        (["--choose-shape"], "--choose-shape: only for plans across processes (add --ranks)"),
        (["--looped"], "--looped: only for plans across processes (add --ranks)"),
        (["--ranks", "--env", "measured", "--workers", "2"], "--workers 2"),
        (["--env", "measured", "--microbatches", "2"], "only --env sim, or --ranks"),
    ],
)
def test_bad_options_across_processes_exit_2_with_one_line(tmp_path, capsys, args, message):
    path = str(tmp_path / "g.json")
    save(uneven_chain(), path)
    rc = main(["train", path, "--cluster", "k80x2", "--iterations", "1", "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


def test_a_run_searches_one_stage_per_rank_unless_told_looped(tmp_path):
    """On this chain the simulator puts a looped plan (4 stages on 2 ranks) ahead of every split; measured, such
    plans ran 16-63 % slower than simulated, so the search keeps to one stage per rank unless told --looped."""
    g, cluster = uneven_chain(12), envs.resolve_cluster("k80x2")
    stages = {}
    for looped in (False, True):
        config = train_config(
            tmp_path / str(looped),
            ranks=True,
            microbatches=4,
            algo="moves",
            iterations=30,
            heuristics=SPLITS,
            looped=looped,
        )
        assert config.one_stage_per_rank is not looped
        result = train(config, graph=g, cluster=cluster)
        best = Placement.load(str(tmp_path / str(looped) / "run" / "best_placement.json"))
        stages[looped] = (RankSim(g, cluster).simulate(best).extra["stages"], result.best_step_time_s)
    assert stages[False][0] == 2 and stages[True][0] > 2 and stages[True][1] < stages[False][1]
    # a looped schedule asked for lets the search score looped plans too
    assert not train_config(tmp_path / "s", ranks=True, schedule="looped_bfs").one_stage_per_rank
