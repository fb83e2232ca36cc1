"""A measured run compares measured with measured: its heuristics are measured on the run's own scorer.

The scorer here is a stand-in for the Ray harness whose times rank the heuristics
otherwise than the simulator does (the simulator's best, m_etf, is not the
fastest "measured" one), so a summary built from simulated times shows it.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import envs
from envs.real.measure_log import RecordedMeasurements
from envs.result import Result
from graphs import OpGraph
from placer import Placement
from placer.cli.train import summary
from placer.learn.progress import Progress
from placer.learn.run_scorers import CachedScorer
from placer.learn.runners import train
from tests.placer.learn.tiny_runs import train_config, two_chains

HEURISTICS = ("single", "m_etf", "heft", "round_robin")


class FakeMeasured:
    """Step time 0.3 s less 10 ms per device change along the ops: round-robin is fastest, one device slowest."""

    def __init__(self) -> None:
        self.scored: list[tuple[int, ...]] = []

    def evaluate(self, placements):
        out = []
        for row in placements:
            row = tuple(int(d) for d in np.asarray(row))
            self.scored.append(row)
            changes = sum(a != b for a, b in zip(row, row[1:]))
            out.append(Result(0.3 - 0.01 * changes, source="measured"))
        return out


def _run(tmp_path, **kw):
    config = train_config(tmp_path, env="measured", heuristics=HEURISTICS, samples=4, iterations=2, **kw)
    env = FakeMeasured()
    result = train(config, graph=two_chains(), cluster=envs.resolve_cluster("k80x2"), env=env)
    return result, env


def test_the_best_heuristic_of_a_measured_run_is_the_best_measured_one(tmp_path):
    result, env = _run(tmp_path, measure_heuristics=2)
    sim = result.heuristics
    assert min(sim, key=sim.get) in ("m_etf", "heft") and sim["round_robin"] > sim["m_etf"]  # the simulator's ranking
    # the two fastest distinct simulated placements (m_etf = heft, round_robin) were measured, single was not
    assert set(result.measured_heuristics) == {"m_etf", "heft", "round_robin"}
    assert (1, 2, 1, 2, 1, 2, 1, 2) in env.scored and (1, 1, 1, 1, 2, 2, 2, 2) in env.scored
    assert result.measured_heuristics["round_robin"] == 0.3 - 0.07
    assert result.best_heuristic == ("round_robin", 0.3 - 0.07)
    assert "round_robin" in result.warm_start  # the warm start imitates the best measured heuristic
    doc = result.to_dict()
    assert doc["best_heuristic_source"] == "measured" and doc["env"] == "measured"
    assert doc["heuristics"]["m_etf"] == sim["m_etf"]  # the simulated times stay, labelled by their key
    lines = {line.split("  ")[0].strip(): line for line in summary(doc).splitlines()}
    gain = (1 - result.best_step_time_s / (0.3 - 0.07)) * 100
    assert lines["best heuristic"].startswith("best heuristic   230.000 ms  measured  (round_robin)")
    words = "as fast as it" if abs(gain) < 0.05 else f"{abs(gain):.1f}% {'faster' if gain > 0 else 'slower'} than it"
    assert f"(learned {words})" in lines["best heuristic"]
    assert lines["best step time"].split("  ")[2] == "measured"
    assert lines["lower bound"].endswith("  simulated")


def test_a_measured_run_that_measures_no_heuristic_says_its_best_heuristic_is_simulated(tmp_path):
    result, _ = _run(tmp_path, measure_heuristics=0)
    assert result.measured_heuristics == {} and result.time_to_beat_heuristic_s is None
    doc = result.to_dict()
    assert doc["best_heuristic_source"] == "simulated"
    (line,) = [line for line in summary(doc).splitlines() if line.startswith("best heuristic")]
    assert "  simulated  (" in line and "not compared" in line and "than it" not in line


def test_a_simulated_run_summary_is_unchanged(tmp_path):
    config = train_config(tmp_path, heuristics=HEURISTICS, samples=4, iterations=1)
    result = train(config, graph=two_chains(), cluster=envs.resolve_cluster("k80x2"))
    text = "\n".join(
        line for line in summary(result.to_dict()).splitlines() if not line.startswith(("placement", "logs"))
    )
    assert result.measured_heuristics == {} and "measured" not in text and "simulated" not in text
    assert "than it)" in text or "as fast as it)" in text


class NoisyMeasured(FakeMeasured):
    """FakeMeasured with a lucky draw: each placement's first measurement is 50 ms fast, every later one true."""

    def evaluate(self, placements):
        seen = set(self.scored)
        out = super().evaluate(placements)
        return [
            Result(
                r.step_time_s - (0.05 if tuple(int(d) for d in np.asarray(p)) not in seen else 0.0), source="measured"
            )
            for r, p in zip(out, placements)
        ]


def test_a_measured_run_re_measures_its_best_and_the_best_heuristic_s_side_by_side(tmp_path):
    heuristics = ("single", "m_etf")
    config = train_config(
        tmp_path, env="measured", heuristics=heuristics, samples=4, iterations=3, rematch=3, measure_heuristics=2
    )
    env = NoisyMeasured()
    graph = two_chains()
    out = io.StringIO()
    progress = Progress(out, tty=False, every_s=0.0)
    result = train(config, graph=graph, cluster=envs.resolve_cluster("k80x2"), env=env, progress=progress)
    lines = out.getvalue().split("side by side, 3 times each")[1].splitlines()[1:]
    assert lines[:3] == [  # after the budget, the rematch shows its progress and ETA (it once printed nothing)
        f"placer: rematch: 1/3 rounds (33%, ETA {lines[0].split('ETA ')[-1]}",
        f"placer: rematch: 2/3 rounds (66%, ETA {lines[1].split('ETA ')[-1]}",
        "placer: rematch: 3/3 rounds (100%)",
    ]
    best = tuple(Placement.load(result.to_dict()["best_placement"]).indices(graph).tolist())
    heuristic = result.best_heuristic[0]
    doc = result.to_dict()
    r = doc["rematch"]
    assert r["heuristic"] == heuristic and r["rounds"] == 3
    # the last 6 measurements are the pair, alternating, 3 rounds; each is its true (second-draw) time
    last = env.scored[-6:]
    assert last[0::2] == [best] * 3 and len(set(last[1::2])) == 1 and last[1] != best
    changes = lambda row: sum(a != b for a, b in zip(row, row[1:]))  # noqa: E731
    assert r["learned_s"] == 0.3 - 0.01 * changes(best) and r["heuristic_s"] == 0.3 - 0.01 * changes(last[1])
    assert r["learned_times_s"] == [r["learned_s"]] * 3
    # the learner's best read was its lucky first draw, 50 ms faster than what the side-by-side medians say; the
    # learner won the side-by-side, and the run's best is its placement at its median, in the result and the file
    assert r["chosen"] == "learned" and abs(doc["policy_step_time_s"] - (r["learned_s"] - 0.05)) < 1e-12
    assert result.best_step_time_s == doc["best_step_time_s"] == r["learned_s"]
    shipped = Placement.load(doc["best_placement"])
    assert shipped.meta["step_time_s"] == r["learned_s"] and shipped.meta["side_by_side"]["rematch"] == r
    assert tuple(shipped.indices(graph).tolist()) == best and not doc["found_by"].startswith("heuristic")
    (line,) = [line for line in summary(doc).splitlines() if line.startswith("side by side")]
    assert f"{heuristic}  measured  (medians of 3 re-measurements each" in line
    gain = (1 - r["learned_s"] / r["heuristic_s"]) * 100
    words = "as fast as it" if abs(gain) < 0.05 else f"{abs(gain):.1f}% {'faster' if gain > 0 else 'slower'} than it"
    assert f"; learned {words}" in line


class LuckyOnGpu1(FakeMeasured):
    """FakeMeasured, but a placement whose first op is on gpu:1 (device 2) is 20 ms slower than its neighbours, and
    its first measurement reads 200 ms fast: the learner's samples find such a lucky read; no heuristic starts there."""

    def evaluate(self, placements):
        seen = set(self.scored)
        out = super().evaluate(placements)
        times = []
        for r, p in zip(out, placements):
            row = tuple(int(d) for d in np.asarray(p))
            t = r.step_time_s + (0.02 if row[0] == 2 else 0.0)
            times.append(t - (0.2 if row[0] == 2 and row not in seen else 0.0))
        return [Result(t, source="measured") for t in times]


def test_where_the_heuristic_wins_the_side_by_side_its_placement_is_the_run_s_best(tmp_path):
    """The learner's best is a lucky read (200 ms fast) of a placement truly slower than round_robin's; the
    side-by-side's medians say so, and best_placement.json, the summary and the result are round_robin's."""
    config = train_config(
        tmp_path, env="measured", heuristics=("single", "round_robin"), samples=4, iterations=3, rematch=3,
        measure_heuristics=2, warm_start="none",
    )  # fmt: skip
    env, graph = LuckyOnGpu1(), two_chains()
    out = io.StringIO()
    result = train(config, graph=graph, cluster=envs.resolve_cluster("k80x2"), env=env, progress=Progress(out))
    doc = result.to_dict()
    r = doc["rematch"]
    assert r["heuristic"] == "round_robin" and r["chosen"] == "heuristic"
    assert r["heuristic_s"] == pytest.approx(0.23) and r["learned_s"] > r["heuristic_s"]  # medians: the truth
    placement = Placement.load(doc["best_placement"])
    assert placement.indices(graph).tolist() == [1, 2, 1, 2, 1, 2, 1, 2]  # round_robin's, not the lucky one
    assert placement.meta["step_time_s"] == pytest.approx(0.23) and placement.meta["side_by_side"]["rematch"] == r
    assert doc["best_step_time_s"] == pytest.approx(0.23) and doc["found_by"] == "heuristic:round_robin"
    assert "round_robin's placement is the faster (medians 230.000 ms" in out.getvalue()
    assert doc["policy_step_time_s"] < 0.1  # the learner's own best: its lucky read
    # the summary says the side-by-side chose it (not that the learner's best, a lucky read, "equals it"), and that
    # the best heuristic's line is the same placement's one measurement
    lines = {line.split("  ")[0].strip(): line for line in summary(doc).splitlines()}
    assert "round_robin's placement, kept: side by side its median beat the learner's best's" in lines["best step time"]
    assert "its one measurement: the best step time above is its median side by side)" in lines["best heuristic"]
    (line,) = [line for line in summary(doc).splitlines() if line.startswith("side by side")]
    assert line.endswith("; round_robin's placement is best_placement.json)")


def test_rematch_zero_skips_the_side_by_side_measurement(tmp_path):
    result, env = _run(tmp_path, measure_heuristics=2, rematch=0)
    assert result.to_dict()["rematch"] is None
    assert "side by side" not in summary(result.to_dict())


class Logged(RecordedMeasurements):
    """A measured env whose results are cached (as one that read its log back on --resume): counts measurements."""

    def __init__(self, graph: OpGraph, cached: dict[str, Result]) -> None:
        self.graph, self.log_path, self._cache, self.measured = graph, None, dict(cached), 0

    def evaluate(self, placements, *, again=False):
        keys = ["".join(map(str, np.asarray(p).tolist())) for p in placements]
        self._begin(again)
        for k in keys:
            if again or k not in self._cache:
                self.measured += 1
                self._record(k, Result(0.1 * self.measured, source="measured"))
        return self._results(keys)


def test_the_scorer_reads_a_measured_envs_results_back_and_measures_again_only_when_asked():
    g = two_chains()
    row = np.zeros((1, g.num_ops), dtype=np.int32)
    env = Logged(g, {"0" * g.num_ops: Result(0.5, source="measured")})
    score = CachedScorer(env)
    assert score(row)[0].tolist() == [0.5] and env.measured == 0  # read back, not measured again
    assert score.fresh(row)[0].tolist() == [0.1] and env.measured == 1  # a re-measurement
    assert score(row)[0].tolist() == [0.5] and env.evaluate(list(row))[0].step_time_s == 0.5  # the first result stays
