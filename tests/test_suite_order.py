"""The suite's files start longest first (tests/conftest.py, tests/durations.json, scripts/suite_durations.py)."""

from __future__ import annotations

import json
import runpy
import types
from pathlib import Path

from tests.conftest import file_order

ROOT = Path(__file__).resolve().parents[1]


def _item(path: str, name: str, slow: bool = False):
    marker = object() if slow else None
    return types.SimpleNamespace(
        path=ROOT / path, name=name, get_closest_marker=lambda m: marker if m == "slow" else None
    )


def test_the_files_a_run_timed_start_longest_first_then_those_with_slow_tests_each_in_its_own_order():
    items = [
        _item("tests/a.py", "a1"),
        _item("tests/b.py", "b1"),
        _item("tests/b.py", "b2", slow=True),
        _item("tests/c.py", "c1"),
        _item("tests/c.py", "c2"),
        _item("tests/d.py", "d1"),
        _item("tests/e.py", "e1", slow=True),
    ]
    seconds = {"tests/c.py": 50, "tests/d.py": 80}
    assert [i.name for i in file_order(items, ROOT, seconds)] == ["d1", "c1", "c2", "b1", "b2", "e1", "a1"]


def test_the_recorded_durations_name_test_files_that_exist():
    doc = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert doc["seconds"] and all((ROOT / f).is_file() and f.startswith("tests/") for f in doc["seconds"])
    assert list(doc["seconds"].values()) == sorted(doc["seconds"].values(), reverse=True)


def test_the_durations_are_written_from_a_run_s_log_and_a_log_without_them_is_a_one_line_error(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "suite_durations.py"))
    log = tmp_path / "ci.log"
    log.write_text(
        "12.5s call     tests/x.py::test_a\n0.5s setup    tests/x.py::test_a\n7.0s call     tests/y.py::test_b[1]\n"
        "1.0s call     tests/z.py::test_c\n2510 passed\n"
    )
    out = tmp_path / "d.json"
    assert script["main"]([str(log), "--commit", "abc1234", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["seconds"] == {"tests/x.py": 13, "tests/y.py": 7} and "abc1234" in doc["about"]
    log.write_text("2510 passed\n")
    assert script["main"]([str(log), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no --durations lines" in err and str(log) in err
    assert script["main"]([str(tmp_path / "missing.log"), "--out", str(out)]) == 2
