"""bench.bound_gap run tiny: every bound part, the winner, and best / bound from bench.budget outputs."""

from __future__ import annotations

import json

import pytest

from bench import bound_gap


def budget_file(tmp_path, graph: str, cluster: str, times: list[float | None]):
    """A bench.budget --json output with one cell and a run per time."""
    runs = [{"method": f"m{i}", "plan_step_time_s": t} for i, t in enumerate(times)]
    path = tmp_path / "budget.json"
    path.write_text(json.dumps({"machine": {}, "cells": [{"graph": graph, "cluster": cluster, "runs": runs}]}))
    return path


@pytest.mark.slow
def test_each_part_and_best_over_bound_from_the_fastest_run(capsys, tmp_path):
    path = budget_file(tmp_path, "moe-60", "k80x2", [0.5, None, 0.25, 0.75])
    quick = ("--blocks-s", "1")  # the block bound's programs get a second per cell (default 60)
    assert (
        bound_gap.main(["--graphs", "moe-60", "--clusters", "k80x2,k80x4", "--best", str(path), *quick, "--json"]) == 0
    )
    first, second = json.loads(capsys.readouterr().out)
    parts = first["parts_s"]
    assert {"critical path", "work", "communicating path", "energetic"} <= set(parts)
    assert first["bound_s"] == pytest.approx(max(parts.values())) == pytest.approx(parts[first["bound_name"]])
    assert {"host issue + path", "energetic", "blocks"} <= set(parts)  # "before": the best but this release's (blocks)
    assert first["before_s"] == max(v for k, v in parts.items() if k not in bound_gap.NEW_PARTS) <= first["bound_s"]
    assert first["best"] == {"step_time_s": 0.25, "method": "m2", "file": str(path)}
    assert first["best_over_bound"] == pytest.approx(0.25 / first["bound_s"])
    assert second["cluster"] == "k80x4" and second["best"] is None and "best_over_bound" not in second
    assert bound_gap.main(["--graphs", "moe-60", "--clusters", "k80x2", "--best", str(path), *quick]) == 0
    out = capsys.readouterr().out
    assert "| moe-60 | k80x2 |" in out and "(m2)" in out


@pytest.mark.parametrize(
    "content, problem",
    [(None, "cannot read"), ("{", "not a bench.budget"), ('{"cells": [{"graph": "g"}]}', "not a bench.budget")],
)
def test_a_bad_best_file_or_graph_exits_2_with_one_line(capsys, tmp_path, content, problem):
    path = tmp_path / "runs.json"
    if content is not None:
        path.write_text(content)
    assert bound_gap.main(["--graphs", "moe-60", "--best", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and problem in err and len(err.splitlines()) == 1
    for bad in ("-1", "nan"):
        assert bound_gap.main(["--graphs", "moe-60", "--blocks-s", bad]) == 2
        err = capsys.readouterr().err
        assert "--blocks-s" in err and len(err.strip().splitlines()) == 1
    assert bound_gap.main(["--graphs", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1
