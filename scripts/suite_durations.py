"""Write tests/durations.json from a test run's ``--durations`` lines: the seconds each test file took.

``tests/conftest.py`` starts the files it names first, the longest first, so that the two workers of ``pytest -n 2``
(``--dist loadfile``: a file runs on one worker) end together instead of one running a long file alone at the end.
Refresh it from a clean-clone CI run whose log has every test's duration::

    PYTEST_ADDOPTS="--durations=0 --durations-min=0.2" CI=true bash .ci/run > ci.log 2>&1
    python scripts/suite_durations.py ci.log --commit "$(git rev-parse --short HEAD)"
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
LINE = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)")


def file_seconds(lines: list[str], at_least: float) -> dict[str, int]:
    """Seconds per test file (its tests' setup, call and teardown summed), the files of ``at_least`` seconds or more,
    longest first.

    >>> log = ["3.5s call     tests/a.py::test_x", "2.0s setup    tests/a.py::test_y", "1.0s call  tests/b.py::t"]
    >>> file_seconds(log, 2)
    {'tests/a.py': 6}
    """
    seconds: collections.Counter = collections.Counter()
    for line in lines:
        m = LINE.match(line)
        if m:
            seconds[m.group(3).split("::")[0]] += float(m.group(1))
    return {f: round(s) for f, s in sorted(seconds.items(), key=lambda x: -x[1]) if s >= at_least}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="a test run's output with --durations lines")
    p.add_argument("--commit", default="", help="the commit the run tested (recorded in the file)")
    p.add_argument("--at-least", type=float, default=5.0, help="leave out files under this many seconds (default 5)")
    p.add_argument("--out", default=str(OUT), help="where to write it (default tests/durations.json)")
    args = p.parse_args(argv)
    try:
        lines = Path(args.log).read_text().splitlines()
    except OSError as e:
        print(f"{args.log}: cannot read it ({e.strerror})", file=sys.stderr)
        return 2
    seconds = file_seconds(lines, args.at_least)
    if not seconds:
        print(f"{args.log}: no --durations lines in it (run with --durations=0)", file=sys.stderr)
        return 2
    commit = args.commit or "an unnamed commit"
    about = (
        f"Seconds each test file took in a CI run (its tests over 0.2 s summed), at {commit} on"
        f" {datetime.date.today().isoformat()}. tests/conftest.py starts the longest files first; refresh with"
        " scripts/suite_durations.py."
    )
    Path(args.out).write_text(json.dumps({"about": about, "seconds": seconds}, indent=1) + "\n")
    print(f"{args.out}: {len(seconds)} files, {sum(seconds.values())} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
