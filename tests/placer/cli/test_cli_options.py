"""Bad output paths, bad numbers and strict JSON across every command (issue 10, items 4, 6, 7, 9).

The bad inputs are generated here from the command templates; each must end in
exit status 2 with one stderr line naming the option, before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import textwrap

import numpy as np
import pytest

import graphs
from graphs import OpGraph, PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main

MODEL_SRC = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), (torch.randn(4, 8),)
    """
)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A graph file, a placement of it, a cluster whose memory fits nothing, and a user model module."""
    monkeypatch.chdir(tmp_path)
    g = random_dag(30, seed=1, name="r30")
    graphs.save(g, tmp_path / "g.json")
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1] * g.num_ops, cluster="k80x2").save(tmp_path / "p.json")
    return tmp_path


@pytest.fixture
def model_module(work, monkeypatch):
    """A user module NAME with build(); NAME:build is a SOURCE for run and profile."""
    name = f"opt_model_{work.name}".replace("-", "_")
    (work / f"{name}.py").write_text(MODEL_SRC)
    monkeypatch.syspath_prepend(str(work))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def model_placement(work, model_module):
    """mp.json: a placement of the user model's graph."""
    from graphs.sources import load_callable
    from graphs.torch_capture import capture

    g = capture(*load_callable(model_module + ":build"))
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1] * g.num_ops, cluster="k80x2").save(work / "mp.json")
    return "mp.json"


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command starts its work (resolving SOURCE) before its checks."""

    def fail(*a, **k):
        raise AssertionError("the command started its work before checking its options")

    from graphs import sources

    for name in ("resolve_graph", "resolve_graph_model_inputs", "resolve_model"):
        monkeypatch.setattr(sources, name, fail)


def one_error_line(capsys, rc: int) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ item 4: output paths
# command -> (argv with OUT where the output goes, the option named, the file suffix)
FILE_OUTPUTS = {
    "place": (["place", "g.json", "--cluster", "k80x2", "-o", "OUT"], "-o", ".json"),
    "simulate": (["simulate", "g.json", "p.json", "--cluster", "k80x2", "--trace", "OUT"], "--trace", ".json"),
    "profile": (["profile", "MODEL", "-o", "OUT"], "-o", ".json"),
    "export": (["export", "g.json", "-o", "OUT"], "-o", ".json"),
    "compare": (["compare", "g.json", "--cluster", "k80x2", "--methods", "single", "--plot", "OUT"], "--plot", ".png"),
}
READ_ONLY_DIR = "/proc"  # no file can be created there, not even by root


def _bad_files(tmp, suffix):
    (tmp / "afile").write_text("x")
    (tmp / "adir").mkdir(exist_ok=True)
    cases = {
        "missing directory": (str(tmp / "nodir" / f"out{suffix}"), "does not exist"),
        "a directory": (str(tmp / "adir"), "is a directory"),
        "parent is a file": (str(tmp / "afile" / f"out{suffix}"), "not a directory"),
        "name too long": (str(tmp / ("x" * 300 + suffix)), "longer than"),
    }
    if os.path.isdir(READ_ONLY_DIR):
        cases["read-only location"] = (f"{READ_ONLY_DIR}/placer-out{suffix}", "cannot write")
    return cases


@pytest.mark.parametrize("command", sorted(FILE_OUTPUTS))
def test_bad_output_files_exit_2_before_any_work(work, model_module, no_work, capsys, command):
    template, option, suffix = FILE_OUTPUTS[command]
    for case, (path, why) in _bad_files(work, suffix).items():
        argv = [path if a == "OUT" else model_module + ":build" if a == "MODEL" else a for a in template]
        line = one_error_line(capsys, main(argv))
        assert option in line and why in line, (case, line)


def test_bad_logdirs_exit_2_before_any_work(work, no_work, capsys):
    (work / "afile").write_text("x")
    cases = {
        "a file": (str(work / "afile"), "is a file"),
        "under a file": (str(work / "afile" / "run"), "is a file"),
        "NUL byte": ("run\0x", "NUL"),
        "name too long": ("r" * 300, "longer than"),
    }
    if os.path.isdir(READ_ONLY_DIR):
        cases["read-only location"] = (f"{READ_ONLY_DIR}/placer-run", "cannot write")
    for case, (logdir, why) in cases.items():
        line = one_error_line(
            capsys, main(["train", "g.json", "--cluster", "k80x2", "--iterations", "1", "--logdir", logdir])
        )
        assert "--logdir" in line and why in line, (case, line)
    assert (work / "afile").read_text() == "x"


# ------------------------------------------------------------------ input files, checked before a capture
# command -> argv with IN where the input file goes (MODEL: a module:callable, which a capture would take seconds on)
FILE_INPUTS = {
    "simulate PLACEMENT": ["simulate", "MODEL", "IN", "--cluster", "k80x2"],
    "simulate --profile": ["simulate", "MODEL", "p.json", "--cluster", "k80x2", "--profile", "IN"],
    "compare --placement": ["compare", "MODEL", "--cluster", "k80x2", "--methods", "single", "--placement", "IN"],
    "compare --profile": ["compare", "MODEL", "--cluster", "k80x2", "--methods", "single", "--profile", "IN"],
    "place --profile": ["place", "MODEL", "--cluster", "k80x2", "-o", "out.json", "--profile", "IN"],
    "run --profile": [
        *("run", "MODEL", "--placement", "p.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--trace", "t.json"),
        *("--profile", "IN"),
    ],
    "place --policy-file": [
        *("place", "MODEL", "--cluster", "k80x2", "--method", "learned", "-o", "out.json", "--policy-file", "IN")
    ],
}


@pytest.mark.parametrize("case", sorted(FILE_INPUTS))
def test_missing_input_files_exit_2_before_the_model_is_captured(work, model_module, no_work, capsys, case):
    """`placer simulate mymodels:build missing.json` once captured the model (seconds) before saying so."""
    (work / "adir").mkdir()
    for path, why in (("missing.json", "no such file"), ("adir", "is a directory")):
        argv = [path if a == "IN" else model_module + ":build" if a == "MODEL" else a for a in FILE_INPUTS[case]]
        line = one_error_line(capsys, main(argv))
        assert path in line and why in line, (case, line)
        option = case.split()[1]
        assert option in line or option == "PLACEMENT", (case, line)


def test_output_checks_leave_nothing_behind(tmp_path):
    from placer.option_checks import check_output_dir, check_output_file

    check_output_file(tmp_path / "a.json", "-o")
    check_output_dir(tmp_path / "x" / "y", "--logdir")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ item 6: numeric options
# command -> (argv template, option -> bad values); generated into one case per (command, option, value)
NUMERIC_OPTIONS = {
    "train": (
        ["train", "g.json", "--cluster", "k80x2", "--no-progress", "--logdir", "run"],
        {
            "--samples": ["0", "-1", "100000"],
            "--iterations": ["0", "-3"],
            "--time-budget": ["0", "-1", "nan", "inf"],
            "--seed": ["-1", str(2**64)],
            "--max-groups": ["-1"],
            "--lr": ["-1", "0", "nan", "inf", "-inf", "2"],
            "--entropy": ["-1", "nan", "inf"],
            "--hidden": ["0", "-4", "1000000"],
            "--workers": ["0", "-2"],
        },
    ),
    "place": (["place", "g.json", "--cluster", "k80x2", "-o", "p2.json"], {"--seed": ["-1", str(2**70)]}),
    "compare": (["compare", "g.json", "--cluster", "k80x2"], {"--seed": ["-5", str(2**64)]}),
    "run": (
        ["run", "MODEL", "--placement", "p.json", "--cluster", "k80x2"],
        {"--steps": ["0", "-1"], "--warmup": ["-1"], "--lr": ["nan", "-1", "0", "inf"]},
    ),
    "profile": (["profile", "MODEL", "-o", "prof.json"], {"--warmup": ["-1"], "--repeats": ["0", "-2"]}),
    "inspect": (["inspect", "g.json"], {"--top": ["-1"]}),
}
NUMERIC_CASES = [
    (cmd, opt, v) for cmd, (_, opts) in NUMERIC_OPTIONS.items() for opt, vals in opts.items() for v in vals
]


@pytest.mark.parametrize("command, option, value", NUMERIC_CASES)
def test_bad_numbers_exit_2_naming_the_option(work, model_module, no_work, capsys, command, option, value):
    template = [model_module + ":build" if a == "MODEL" else a for a in NUMERIC_OPTIONS[command][0]]
    if command == "train" and option not in ("--iterations", "--time-budget"):
        template = template + ["--iterations", "1"]  # (the two exclude each other)
    line = one_error_line(capsys, main(template + [f"{option}={value}"]))
    assert line.startswith(f"placer: error: {option} "), line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_place_option_values_must_be_finite(work, no_work, capsys, value):
    line = one_error_line(
        capsys,
        main(
            [
                "place",
                "g.json",
                "--cluster",
                "k80x2",
                "-o",
                "q.json",
                "--method",
                "annealing",
                "--option",
                f"steps={value}",
            ]
        ),
    )
    assert "--option" in line and "not a finite number" in line


def _bad_values(bounds: dict, integer: bool) -> list:
    """Values outside ``bounds`` (a check_int/check_float bounds dict), plus values of the wrong type."""
    out: list = [True, "3", None]
    step = 1 if integer else 1e-9
    for key, value in bounds.items():
        if key in ("least", "above"):
            out.append(value - step if key == "least" else value)
        else:
            out.append(value + step if key == "most" else value)
    if integer:
        out.append(1.5)
    else:
        out += [math.nan, math.inf, -math.inf]
    return out


def test_every_numeric_train_config_field_is_range_checked():
    from placer.learn.config import FLOAT_FIELDS, INT_FIELDS, OPTIONAL, TrainConfig

    assert OPTIONAL >= {"iterations", "time_budget_s", "max_groups", "workers"}
    numeric = {f.name for f in dataclasses.fields(TrainConfig) if any(t in str(f.type) for t in ("int", "float"))}
    numeric -= {"heuristics"}
    assert numeric == set(INT_FIELDS) | set(FLOAT_FIELDS)
    for table, integer in ((INT_FIELDS, True), (FLOAT_FIELDS, False)):
        for name, (option, bounds) in table.items():
            for bad in _bad_values(bounds, integer):
                if bad is None and name in OPTIONAL:
                    continue  # None means "not set" there
                config = TrainConfig(**{name: bad, "iterations": 1 if name != "iterations" else bad, "logdir": None})
                with pytest.raises(PlacerError, match=f"^{option} "):
                    config.validate()


def test_entropy_nan_no_longer_trains_to_nan(tmp_path):
    """`--entropy nan` used to train silently to NaN weights with exit 0."""
    import envs
    from placer.learn.config import TrainConfig
    from placer.learn.runners import train

    g = random_dag(20, seed=0, name="r20")
    config = TrainConfig(
        iterations=2, entropy_coef=float("nan"), logdir=str(tmp_path / "run"), progress=False, heuristics=()
    )
    with pytest.raises(PlacerError, match="--entropy nan"):
        train(config, graph=g, cluster=envs.resolve_cluster("k80x2"))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ item 9: strict JSON
def _refuse(name):
    raise ValueError(f"not JSON: {name}")


def strict_loads(text: str):
    return json.loads(text, parse_constant=_refuse)


def test_json_safe_nulls_non_finite_numbers():
    from placer.cli import json_safe, to_json

    doc = {
        "a": float("inf"),
        "b": [float("nan"), 1.5, np.float64("-inf"), np.int64(3)],
        "c": (np.array([1.0, np.inf]),),
    }
    assert strict_loads(to_json(doc)) == {"a": None, "b": [None, 1.5, None, 3], "c": [[1.0, None]]}
    assert json_safe({"ok": True, "n": 0}) == {"ok": True, "n": 0}


@pytest.fixture
def oom_cluster(work):
    """k80x2 with 1 kB of memory per device: every placement of g.json is out of memory."""
    from envs.cluster import Cluster

    doc = Cluster.preset("k80x2").to_dict()
    for d in doc["devices"]:
        d["memory_bytes"] = 1000
    path = work / "oom.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.slow
def test_every_json_output_is_strict_json_on_oom_and_infinite_values(
    work, model_module, model_placement, oom_cluster, capsys, monkeypatch
):
    import torch

    import envs
    import envs.real.timing
    from graphs import zoo

    # infinite values where the commands have none of their own: an unbounded step, infinite FLOPs
    monkeypatch.setattr(envs.SimEnv, "lower_bound", lambda self, blocks_s=0.0, host_step="after": float("inf"))
    monkeypatch.setattr(zoo, "info", lambda **k: [{"name": "m", "ops": 1, "flops": float("nan"), "params": 1}])

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(envs.real.timing, "measure_steps", oom)
    model = model_module + ":build"
    commands = {
        "clusters": ["clusters", oom_cluster, "--json"],
        "simulate": ["simulate", "g.json", "p.json", "--cluster", oom_cluster, "--json"],
        "compare": ["compare", "g.json", "--cluster", oom_cluster, "--methods", "single,round_robin", "--json"],
        "train": [
            "train",
            "g.json",
            "--cluster",
            oom_cluster,
            "--iterations",
            "2",
            "--hidden",
            "8",
            "--max-groups",
            "4",
            "--logdir",
            "run",
            "--json",
        ],
        "run": ["run", model, "--placement", model_placement, "--cluster", "k80x2", "--device-map", "*=cpu", "--json"],
        "profile": ["profile", model, "-o", "prof.json", "--repeats", "1", "--json"],
        "graphs": ["graphs", "--json"],
        "export": ["export", "g.json", "-o", "g2.json", "--json"],
        "inspect": ["inspect", "g.json", "--json"],
    }
    statuses = {}
    for name, argv in commands.items():
        if name == "export":
            monkeypatch.setattr(OpGraph, "total_flops", property(lambda self: float("inf")))
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc in (0, 1), (name, err)
        doc = strict_loads(out)  # raises on Infinity / NaN
        statuses[name] = doc.get("status") if isinstance(doc, dict) else None
    assert statuses["simulate"] == "oom" and statuses["run"] == "oom" and statuses["train"] == "no_placement"


# ------------------------------------------------------------------ item 7: a graph without ops
def test_zero_op_graph(work, capsys):
    graphs.save(OpGraph.from_edges([], [], name="empty"), work / "empty.json")
    line = one_error_line(
        capsys, main(["train", "empty.json", "--cluster", "k80x2", "--iterations", "1", "--logdir", "run"])
    )
    assert "empty.json" in line and "no ops" in line
    # the commands that have an answer for an empty graph give it
    assert main(["place", "empty.json", "--cluster", "k80x2", "-o", "e.json"]) == 0
    capsys.readouterr()
    assert main(["simulate", "empty.json", "e.json", "--cluster", "k80x2", "--json"]) == 0
    assert strict_loads(capsys.readouterr().out)["step_time_s"] == 0
    assert main(["compare", "empty.json", "--cluster", "k80x2", "--methods", "single", "--json"]) == 0
    assert strict_loads(capsys.readouterr().out)["rows"][0]["status"] == "ok"
