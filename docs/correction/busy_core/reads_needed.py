"""How many reads a side-by-side needs at the noise of these runs: ``python docs/correction/busy_core/reads_needed.py
FILE [FILE ...]`` (``bench.correction ranks --json`` files).

The noise is the standard deviation of log step time between the reads of one plan, over every plan read more than
once (the bench's side-by-side and each method's own finals); the reads that tell two plans apart at 95 % (two-sided,
on the means of the logs) are 2 (1.96 sd / log(1 / (1 - d)))^2 of each, for a difference d."""

import json
import sys

import numpy as np


def widths(paths: list[str]) -> np.ndarray:
    out = []
    for path in paths:
        for cell in json.load(open(path)).get("cells", []):
            groups = list(cell.get("side_by_side", {}).values())
            groups += [t for r in cell.get("methods", {}).values() for t in (r.get("finals") or {}).values()]
            for times in groups:
                ok = [t for t in times if t and np.isfinite(t)]
                if len(ok) > 1:
                    out.append(np.std(np.log(ok), ddof=1))
    return np.array(out)


def main(paths: list[str]) -> None:
    sd = widths(paths)
    rms = float(np.sqrt(np.mean(sd**2)))
    print(f"{len(sd)} plans read more than once: log sd median {np.median(sd):.3f}, rms {rms:.3f}")
    for d in (0.05, 0.10, 0.20):
        n = 2 * (1.96 * rms / np.log(1 / (1 - d))) ** 2
        print(f"  to tell plans {d:.0%} apart: {int(np.ceil(n))} reads of each")


if __name__ == "__main__":
    main(sys.argv[1:])
