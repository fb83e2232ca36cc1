"""The parser's own errors: exit 2, one line, and a suggestion for a mistyped option, command or choice."""

from __future__ import annotations

import pytest

from placer.cli import build_parser, main

# argv -> what the one line must say (None: no suggestion, only the culprit named)
MISTYPED = {
    "an option": (
        ["compare", "g.json", "--clustr", "k80x4"],
        "unrecognized argument --clustr: did you mean --cluster?",
    ),
    "an option with =": (["compare", "g.json", "--clustr=k80x4"], "did you mean --cluster?"),
    "an option after the required ones": (
        ["compare", "g.json", "--cluster", "k80x4", "--methds", "all"],
        "did you mean --methods?",
    ),
    "train's option": (["train", "g.json", "--clustr", "k80x4"], "did you mean --cluster?"),
    "an option of the top level": (["--hlep"], "did you mean --help?"),
    "a command": (["comapre", "g.json", "--cluster", "k80x4"], "invalid choice: 'comapre' (did you mean 'compare'?"),
    "a command with a dash": (["export_map", "p.json"], "did you mean 'export-map'?"),
    "a choice": (["compare", "g.json", "--cluster", "k80x4", "--score-order", "planed"], "did you mean 'planned'?"),
    "nothing close": (["compare", "g.json", "--cluster", "k80x4", "--zzqqxx"], "unrecognized argument --zzqqxx"),
}


@pytest.mark.parametrize("case", sorted(MISTYPED))
def test_a_mistyped_name_gets_one_line_with_a_suggestion(case, capsys):
    argv, needle = MISTYPED[case]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert ("did you mean" in err) == (case != "nothing close"), err


def test_known_options_abbreviations_and_negative_numbers_still_parse():
    parser = build_parser()
    args = parser.parse_args(["compare", "g.json", "--clus", "k80x4", "--bound-seconds", "-1"])
    assert args.cluster == "k80x4" and args.bound_seconds == -1.0  # (the range is the command's to check)
    assert parser.parse_args(["inspect", "g.json", "--top", "-1"]).top == -1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["compare", "g.json", "--cluster", "k80x4", "--methods", "single,m_eft"],
            "--methods: unknown placement method 'm_eft'",
        ),
        (
            ["place", "g.json", "--cluster", "k80x4", "--method", "anealing", "-o", "p.json"],
            "--method: unknown placement method 'anealing'",
        ),
    ],
)
def test_a_mistyped_heuristic_gets_a_suggestion(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # (no g.json: the names are checked before the graph is read)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and "did you mean" in err, err


def test_the_top_level_help_says_what_the_default_learner_is():
    """The default learner has no policy network: a move search whose moves a learned critic ranks."""
    text = " ".join(build_parser().format_help().split())
    description = text.split("positional arguments")[0]
    assert "move search" in description and "critic" in description and "--algo moves" in description
    assert "--algo reinforce" in description and "seq2seq policy" in description
