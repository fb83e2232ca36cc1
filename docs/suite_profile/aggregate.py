"""Where the suite's CPU goes: py-spy's samples of every process of a suite run, summed.

Record (py-spy is not a dependency: ``pip install py-spy``)::

    py-spy record --subprocesses --format raw -r 20 -o suite.txt -- python -m pytest -n 2

then ``python docs/suite_profile/aggregate.py suite.txt``. Each line of the raw file is a stack (its processes
first, then its frames) and a count of samples, at 20 a second. Printed: the seconds of samples by test (the test
worker's own frames; the processes a test starts are listed by their command line), by project function (every
sample whose stack holds it), and by the innermost frame.
"""

import collections
import re
import sys

RATE = 20.0
PROJECT = re.compile(r"^(\S+) \(((?:graphs|envs|placer|policies|bench)/[^:]+):\d+\)$")
TEST = re.compile(r"^(test_\S+) \((test_[^:]+|[\w/]+/test_[^:]+):\d+\)$")


def main(path: str, top: int = 40) -> None:
    by_test: collections.Counter = collections.Counter()
    by_function: collections.Counter = collections.Counter()
    by_leaf: collections.Counter = collections.Counter()
    total = 0
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue  # a stack whose command line held a newline: its first part only
        n = int(count)
        total += n
        frames = stack.split(";")
        processes = [f for f in frames if f.startswith("process ")]
        if len(processes) > 2:  # pytest, its worker, and a process the worker started
            key = "process: " + " ".join(re.sub(r"process \d+:", "", processes[-1]).split())[:100]
        else:
            key = next((f"{m[2]}::{m[1]}" for m in map(TEST.match, frames) if m), "worker, outside a test")
        by_test[key] += n
        seen = set()
        for frame in frames:
            m = PROJECT.match(frame)
            if m and (m[2], m[1]) not in seen:
                seen.add((m[2], m[1]))
                by_function[f"{m[2]}:{m[1]}"] += n
        by_leaf[frames[-1][:120]] += n
    print(f"{total} samples: {total / RATE:.0f} s of CPU")
    tables = (("by test or process", by_test), ("by project function", by_function), ("innermost", by_leaf))
    for title, counter in tables:
        print(f"== {title}")
        for key, n in counter.most_common(top):
            print(f"{n / RATE:8.1f} s  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
