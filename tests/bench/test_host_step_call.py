"""bench.host_step_call: a call's fixed cost on this host (envs.real.profiler.host.time_step_call), and the
step_call_s it implies."""

from __future__ import annotations

import json

import pytest

from bench import host_step_call
from envs.real.profiler.host import call_cost


def test_it_runs_and_reports_the_step_call_s_of_the_host(capsys):
    assert host_step_call.main(["--counts", "1,4", "--numel", "8", "--repeats", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["paths"]) == {"fused", "foreach"} and doc["counts"] == [1, 4]
    for r in doc["paths"].values():
        assert len(r["seconds"]) == 2 and all(s > 0 for s in r["seconds"])
        assert r["call_s"] == call_cost([1, 4], r["seconds"])
        assert r["step_call_s"] == max(r["call_s"], 0.0)


def test_the_counts_must_start_at_one(capsys):
    with pytest.raises(SystemExit) as stop:
        host_step_call.main(["--counts", "2,4"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("host_step_call: --counts must start at 1")
