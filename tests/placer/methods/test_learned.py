"""`placer pretrain`, `placer place --method learned` and `placer train --init` through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

import graphs
from graphs.plan import Placement
from graphs.synthetic import branch_dag
from placer.cli import main
from policies.gnn import GNNNet

#: What a placer train of these tests needs of the heuristics (the best one to imitate), and no equal-budget search.
FEW_HEURISTICS = ("--heuristics", "single,m_etf", "--no-equal-budget-search")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def place_learned_cli(capsys, gpath, cluster: str, out_path, *argv: str):
    """``placer place GRAPH --cluster CLUSTER --method learned ARGV -o OUT``: ``(rc, out, err)``."""
    return run(capsys, "place", str(gpath), "--cluster", cluster, "--method", "learned", *argv, "-o", str(out_path))


def train_from(capsys, gpath, init, *argv: str):
    """``placer train GRAPH --cluster k80x2 --init INIT ARGV`` without progress, few heuristics: ``(rc, out, err)``."""
    return run(
        capsys, "train", gpath, "--cluster", "k80x2", "--init", str(init), *argv, "--no-progress", *FEW_HEURISTICS
    )


@pytest.fixture
def pretrained(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    graphs.save(branch_dag(120, seed=1), corpus / "b1.json")
    gpath = tmp_path / "g.json"
    graphs.save(branch_dag(150, seed=5, width=3), gpath)
    rc, out, err = run(
        capsys,
        "pretrain",
        "--corpus",
        str(corpus),
        "--clusters",
        "k80x2",
        "--time-budget",
        "2",
        "--hidden",
        "16",
        "--rounds",
        "1",
        "--switch-share",
        "0.3",
        "-o",
        str(tmp_path / "p.pt"),
        "--json",
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["pairs"][0]["graph"] == "b1.json" and (tmp_path / "p.json").exists()
    assert doc["training"]["switch_share"] == 0.3
    return tmp_path, str(gpath)


@pytest.mark.slow
def test_pretrain_then_place_learned_on_an_unseen_cluster_size(pretrained, capsys):
    tmp, gpath = pretrained
    rc, out, err = place_learned_cli(
        capsys, gpath, "k80x4", tmp / "out.json", "--policy-file", str(tmp / "p.pt"), "--samples", "4"
    )
    assert rc == 0, err
    assert "best of " in out and " decodes of the policy" in out
    p = Placement.load(str(tmp / "out.json"))
    assert (
        p.method == "learned"
        and p.meta["policy_file"] == str(tmp / "p.pt")
        and len(p.assignment) == graphs.load(gpath).num_ops
    )
    # greedy over the ops, then greedy + 4 samples at each group count that gives a new number of groups
    assert p.meta["groups"] == [128, 256, 512, "modules"] and p.meta["decodes"] >= 1 + 5
    assert p.meta["found_by"].removeprefix("descent from ").split(" (")[0] in ("greedy", "sample")


def test_place_learned_decodes_each_group_count_and_keeps_the_best_simulated():
    import envs
    from placer.methods.learned import place_learned

    g, c = branch_dag(300, seed=3), envs.resolve_cluster("k80x2")
    only_ops = place_learned(g, c, samples=3, groups=())
    assert only_ops.meta["decodes"] == 4 and only_ops.meta["found_by"].endswith("(ops)")
    assert only_ops.meta["refine_simulated"] == 0  # the ops are too many items to descend over
    both = place_learned(g, c, samples=3, groups=(20, 40, 40), refine=0)  # a repeated count is decoded once
    assert both.meta["decodes"] == 1 + 4 + 4 and both.meta["groups"] == [20, 40, 40]
    env = envs.SimEnv(g, c)
    # the op-level greedy is one of the candidates, so the best of all is never slower than it
    assert both.meta["node_order_step_time_s"] <= both.meta["greedy_step_time_s"] + 1e-12
    t, _ = env.step_times(both.indices(g, c.device_names)[None])
    assert abs(float(t[0]) - both.meta["node_order_step_time_s"]) < 1e-9


def test_place_learned_decodes_each_module_level(tmp_path, capsys):
    import envs
    from envs.sim.sim_graph import schedule_graph
    from graphs.module_tree import module_levels
    from placer.methods.learned import place_learned

    g, c = branch_dag(300, seed=3), envs.resolve_cluster("k80x2")
    levels = module_levels(schedule_graph(g))
    assert levels  # one group per block
    p = place_learned(g, c, samples=3, groups=("modules",), refine=0)
    # per module view: greedy + 3 samples at each of the two temperatures
    assert p.meta["decodes"] == 1 + 7 * len(levels) and p.meta["groups"] == ["modules"]
    assert p.meta["module_temperatures"] == [1.0, 4.0]
    one = place_learned(g, c, samples=3, groups=("modules",), module_temperatures=(4.0,), refine=0)
    assert one.meta["decodes"] == 1 + 4 * len(levels)
    assert one.meta["found_by"].startswith(("greedy", "sample at T=4"))
    env = envs.SimEnv(g, c)
    # the best module-level decode is kept: the policy decides where each block goes, a block is never split
    t, _ = env.step_times(p.indices(g, c.device_names)[None])
    assert abs(float(t[0]) - p.meta["node_order_step_time_s"]) < 1e-9
    if "modules depth" in p.meta["found_by"]:
        dev = p.indices(g, c.device_names)
        for path in set(g.module_paths) - {""}:
            assert len({int(dev[i]) for i, q in enumerate(g.module_paths) if q == path}) == 1, path
    gpath = tmp_path / "g.json"
    graphs.save(g, gpath)
    rc, out, err = place_learned_cli(
        capsys, gpath, "k80x2", tmp_path / "o.json", "--groups", "modules", "--samples", "2"
    )
    assert rc == 0, err
    assert Placement.load(str(tmp_path / "o.json")).meta["decodes"] == 1 + 5 * len(levels)


def test_place_learned_refines_its_decodes_by_descent_within_the_budget(tmp_path, capsys):
    import envs
    from placer.methods.learned import place_learned

    g, c = branch_dag(300, seed=3), envs.resolve_cluster("k80x4")
    plain = place_learned(g, c, samples=3, groups=(20, "modules"), refine=0)
    assert plain.meta["refine_stopped"] == "off" and plain.meta["refine_simulated"] == 0
    assert plain.meta["node_order_step_time_s"] == plain.meta["decode_step_time_s"]
    refined = place_learned(g, c, samples=3, groups=(20, "modules"), refine=200, refine_time_s=60)
    m = refined.meta
    assert m["decode_step_time_s"] == plain.meta["decode_step_time_s"]  # the same decodes, then the descent
    assert 0 < m["refine_simulated"] <= 200 and m["refine_stopped"] in ("budget", "no start left")
    assert m["node_order_step_time_s"] <= m["decode_step_time_s"]
    t, _ = envs.SimEnv(g, c).step_times(refined.indices(g, c.device_names)[None])
    assert float(t[0]) == pytest.approx(m["node_order_step_time_s"], abs=1e-12)
    if m["found_by"].startswith("descent from") and "modules depth" in m["found_by"]:
        dev = refined.indices(g, c.device_names)  # a descent moves whole groups: a block is never split
        for path in set(g.module_paths) - {""}:
            assert len({int(dev[i]) for i, q in enumerate(g.module_paths) if q == path}) == 1, path
    assert (
        place_learned(g, c, samples=3, groups=(20, "modules"), refine=200, refine_time_s=0).meta["refine_stopped"]
        == "time"
    )
    gpath = tmp_path / "g.json"
    graphs.save(g, gpath)
    rc, out, err = place_learned_cli(
        capsys, gpath, "k80x4", tmp_path / "o.json", "--samples", "3", "--groups", "20,modules", "--refine", "0"
    )
    assert rc == 0, err
    assert "refining" not in out and Placement.load(str(tmp_path / "o.json")).meta["refine"] == 0
    rc, out, err = place_learned_cli(capsys, gpath, "k80x4", tmp_path / "o.json", "--samples", "3", "--groups", "20")
    assert rc == 0, err
    assert " placements simulated refining the decodes (stopped: " in out


def test_place_learned_bad_groups_and_stray_options_exit_2(tmp_path, capsys):
    gpath = tmp_path / "g.json"
    graphs.save(branch_dag(60, seed=1), gpath)
    for argv, msg in (
        (["--method", "learned", "--groups", "1"], "--groups"),
        (["--method", "learned", "--groups", "a,b"], "--groups"),
        (["--method", "learned", "--groups", "128,module"], "the word modules"),
        (["--method", "m_etf", "--groups", "64"], "only with --method learned"),
        (["--method", "m_etf", "--samples", "4"], "only with --method learned"),
        (["--method", "m_etf", "--refine", "10"], "only with --method learned"),
        (["--method", "learned", "--refine", "-1"], "--refine"),
    ):
        rc, out, err = run(capsys, "place", str(gpath), "--cluster", "k80x2", *argv, "-o", str(tmp_path / "o.json"))
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_train_init_fine_tunes_the_pretrained_policy(pretrained, capsys):
    tmp, gpath = pretrained
    rc, out, err = train_from(capsys, gpath, tmp / "p.pt", "--iterations", "2", "--logdir", str(tmp / "run"), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    # the pretrained weights first imitate the best heuristic (over groups cut where it changes device)
    assert doc["iterations"] == 2 and doc["warm_start"].startswith("imitation of ") and doc["status"] == "ok"
    assert doc["num_items"] < graphs.load(gpath).num_ops
    state = json.loads((tmp / "run" / "checkpoint.json").read_text())
    assert state["config"]["policy"] == "gnn" and state["config"]["init"] == str(tmp / "p.pt")
    # fine-tuning explores more, and imitates at pretraining's rate, unless told otherwise
    assert state["config"]["entropy_coef"] == 0.01 and state["config"]["warm_start_lr"] == 0.003
    # the weights trained are the pretrained ones: one RL step (no imitation) moves each by at most Adam's lr
    lr = 1e-4
    rc, out, err = train_from(
        capsys,
        gpath,
        tmp / "p.pt",
        *("--iterations", "1", "--warm-start", "none", "--lr", str(lr), "--entropy", "0.002"),
        *("--logdir", str(tmp / "run2"), "--json"),
    )
    assert rc == 0, err
    assert json.loads((tmp / "run2" / "checkpoint.json").read_text())["config"]["entropy_coef"] == 0.002
    pretrained_net = torch.load(tmp / "p.pt", weights_only=True)
    tuned = torch.load(tmp / "run2" / "checkpoint.pt", weights_only=True)["policy"]
    assert set(pretrained_net) == {k.removeprefix("net.") for k in tuned}
    step = max(float((tuned["net." + k] - v).abs().max()) for k, v in pretrained_net.items())
    fresh = GNNNet(**{k: v for k, v in json.loads((tmp / "p.json").read_text())["architecture"].items()}).state_dict()
    assert step <= 1.01 * lr < 0.01 < max(float((fresh[k] - v).abs().max()) for k, v in pretrained_net.items())


@pytest.mark.slow
def test_bad_policy_files_exit_2_with_one_line(pretrained, capsys):
    tmp, gpath = pretrained
    side = json.loads((tmp / "p.json").read_text())
    side["architecture"]["rounds"] = 5
    (tmp / "bad.json").write_text(json.dumps(side))
    (tmp / "bad.pt").write_bytes((tmp / "p.pt").read_bytes())
    (tmp / "junk.pt").write_bytes(b"not a torch file")
    (tmp / "junk.json").write_text((tmp / "p.json").read_text())
    for f, msg in (
        ("bad.pt", "do not fit"),
        ("junk.pt", "cannot read policy weights"),
        ("none.pt", "no such"),  # place checks its inputs first ("no such file"); train --init: "no such policy file"
    ):
        rc, out, err = place_learned_cli(capsys, gpath, "k80x2", tmp / "o.json", "--policy-file", str(tmp / f))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and msg in err and f in err, err
        rc, out, err = train_from(capsys, gpath, tmp / f, "--iterations", "1", "--logdir", str(tmp / f"run-{f}"))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and msg in err, err
    rc, out, err = train_from(capsys, gpath, tmp / "p.pt", "--policy", "seq2seq", "--iterations", "1")
    assert rc == 2 and "--init" in err
    rc, out, err = run(
        capsys, "place", gpath, "--cluster", "k80x2", "--policy-file", str(tmp / "p.pt"), "-o", str(tmp / "o.json")
    )
    assert rc == 2 and "--policy-file" in err


def test_pretrain_bad_options_exit_2(tmp_path, capsys):
    for argv, msg in (
        (["--clusters", "nope"], "nope"),
        (["--sizes", "5"], "--sizes"),
        (["--corpus", "zzz"], "zzz"),
        (["--dagger", "2"], "--dagger"),
        (["--groups", "1"], "--groups"),
        (["--groups", "x"], "--groups"),
        (["--switch-share", "1"], "--switch-share"),
        (["--switch-share", "-0.1"], "--switch-share"),
    ):
        rc, out, err = run(capsys, "pretrain", *argv, "--time-budget", "1", "-o", str(tmp_path / "p.pt"))
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = run(capsys, "pretrain", "-o", str(tmp_path / "p.bin"))
    assert rc == 2 and ".pt" in err
    with pytest.raises(SystemExit) as e:  # argparse's own choice check
        main(["pretrain", "--decoder", "beam", "-o", str(tmp_path / "p.pt")])
    assert e.value.code == 2 and "beam" in capsys.readouterr().err
