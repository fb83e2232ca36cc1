"""The measurement log of envs.measured: a torn last line never swallows the next record (no Ray needed)."""

from __future__ import annotations

import json

import envs
from envs.measured import LOG_NAME, MeasuredEnv, read_log
from envs.result import Result
from graphs import OpGraph


def test_a_record_after_a_torn_line_is_kept(tmp_path, capsys):
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], name="ab")
    log = tmp_path / LOG_NAME
    good = {"graph_hash": g.content_hash, "placement_hash": "p1", "time_unix": 0.0, "result": Result(0.5, "ok").to_dict()}
    log.write_text(json.dumps(good) + "\n" + json.dumps(good)[:30])  # a run killed mid-write
    env = MeasuredEnv("unused:build", envs.resolve_cluster("k80x2"), graph=g, run_dir=tmp_path, device_map="*=cpu")
    assert set(env._cache) == {"p1"}
    assert "skipped 1 unreadable line" in capsys.readouterr().err
    env._record("p2", Result(0.25, "ok", source="measured"))
    got = read_log(str(log), g.content_hash)
    assert set(got) == {"p1", "p2"} and got["p2"].step_time_s == 0.25
    assert log.read_text().endswith("\n")
    env._record("p3", Result(float("inf"), "oom", source="measured"))
    assert set(read_log(str(log), g.content_hash)) == {"p1", "p2", "p3"}
