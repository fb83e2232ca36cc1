"""bench.host_step_call: a call's fixed cost, from steps over 1 and k parameters, and the step_call_s it implies."""

from __future__ import annotations

import json

import pytest

from bench import host_step_call
from envs.machines import CPU_LAUNCH_S


def test_the_call_cost_is_what_merging_calls_saves():
    # one call over k parameters takes 30 + 10 k us: k calls of one take 40 k, (k - 1) x 30 us more
    assert host_step_call.call_cost([1, 2, 4, 8], [1e-6 * (30 + 10 * k) for k in (1, 2, 4, 8)]) == pytest.approx(30e-6)
    # the median of the counts' estimates, not their mean: one noisy count does not move it
    assert host_step_call.call_cost([1, 2, 4, 8], [40e-6, 50e-6, 70e-6, 10e-6]) == pytest.approx(30e-6)
    assert host_step_call.call_cost([1], [40e-6]) == 40e-6


def test_it_runs_and_reports_the_step_call_s_of_the_host(capsys):
    assert host_step_call.main(["--counts", "1,4", "--numel", "8", "--repeats", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["paths"]) == {"fused", "foreach"} and doc["counts"] == [1, 4]
    for r in doc["paths"].values():
        assert len(r["seconds"]) == 2 and all(s > 0 for s in r["seconds"])
        assert r["call_s"] == host_step_call.call_cost([1, 4], r["seconds"])
        assert r["step_call_s"] == max(r["call_s"] - CPU_LAUNCH_S, 0.0)


def test_the_counts_must_start_at_one(capsys):
    with pytest.raises(SystemExit) as stop:
        host_step_call.main(["--counts", "2,4"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("host_step_call: --counts must start at 1")
