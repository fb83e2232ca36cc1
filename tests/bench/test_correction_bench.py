"""bench.correction and bench.repeatability run tiny: every method at equal measurements, one-line errors."""

from __future__ import annotations

import json

import pytest

from bench import correction, repeatability


@pytest.mark.slow  # four measured searches on a 30-op graph (~10 s)
def test_the_stand_in_table_has_every_method_at_equal_measurements(capsys):
    argv = ["stand-in", "--graphs", "moe-30", "--clusters", "k80x2", "--measurements", "5", "--sim-evals", "200"]
    rc = correction.main([*argv, "--round-evals", "60", "--truth-evals", "300", "--rematch", "2", "--json"])
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert rc == 0 and set(cell["methods"]) == set(correction.METHODS)
    for method in ("corrected", "simulator rank", "measured moves"):
        assert cell["methods"][method]["measured"] <= 5, method
    assert all(len(times) == 2 for times in cell["side_by_side"].values())
    assert "| moe-30 | k80x2 | 0 | corrected | " in correction.markdown_table([cell])


@pytest.mark.parametrize(
    "module,argv,option",
    [
        (correction, ["stand-in", "--measurements", "1"], "--measurements"),
        (correction, ["local"], "--source"),
        (correction, ["stand-in", "--graphs", "nope"], "nope"),
        (repeatability, ["--scenario", "tiny", "--builds", "1"], "--builds"),
        (repeatability, [], "--source"),
    ],
)
def test_bad_options_exit_2_with_one_line(module, argv, option, capsys):
    try:
        rc = module.main(argv)
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and option in err and len(err.strip().splitlines()) == 1, err


def test_the_repeatability_figures():
    builds = [{"step_time_s": t, "step_times_s": [t * 0.9, t, t * 1.2]} for t in (1.0, 1.1, 1.0, 1.2)]
    s = repeatability.summary(builds)
    assert s["pair_diff"] == pytest.approx(sorted([0.1 / 1.05, 0.1 / 1.05, 0.2 / 1.1])[1])
    assert s["halves"] == pytest.approx(1.1 / 1.05) and s["first_over_rest"] == pytest.approx(1.0 / 1.1)
    assert s["in_build_spread"] == pytest.approx(0.3)


@pytest.mark.slow  # three move searches on a tiny graph (~5 s)
def test_critic_hits_counts_each_arm_for_each_critic(capsys):
    from bench import critic_hits

    rc = critic_hits.main(["--graphs", "moe-40", "--clusters", "k80x2", "--evals", "150", "--early", "3", "--json"])
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert rc == 0 and [r["critic"] for r in runs] == list(critic_hits.CRITICS)
    for r in runs:
        assert all(h <= t for h, t in zip(r["all"]["hits"], r["all"]["tries"]))
        assert sum(r["early"]["tries"]) <= sum(r["all"]["tries"]) and r["rounds"] > 3
    fresh, pretrained = runs[0], runs[1]
    assert pretrained["early"]["tries"][1] > fresh["early"]["tries"][1]  # the pretrained critic ranks from round 1
    assert critic_hits.main(["--critics", "nope"]) == 2 and "--critics" in capsys.readouterr().err


@pytest.mark.slow  # two measured searches on a 30-op graph (~5 s)
def test_an_interrupted_run_prints_the_methods_it_finished(capsys, monkeypatch):
    def deadline(*args, **kwargs):
        raise KeyboardInterrupt  # what timeout --signal=INT does to the run, here when the third method starts

    monkeypatch.setattr(correction, "measured_move_search", deadline)
    argv = ["stand-in", "--graphs", "moe-30", "--clusters", "k80x2", "--measurements", "4", "--sim-evals", "150"]
    rc = correction.main([*argv, "--round-evals", "50", "--truth-evals", "200", "--json"])
    out = json.loads(capsys.readouterr().out)
    (cell,) = out["cells"]
    assert rc == 130 and out["interrupted"] is True
    assert set(cell["methods"]) == {"corrected", "simulator rank", "simulator"} and "side_by_side" not in cell
    table = correction.markdown_table([cell])
    assert "| moe-30 | k80x2 | 0 | corrected | " in table and "measured moves" not in table
    assert table.splitlines()[-1].endswith("| - | - |")  # nothing re-measured: no ratios
