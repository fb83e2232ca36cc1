"""Paired ratios from variants.py's output: per build, each setting's step over the first setting's (same plan),
and each plan's over the last plan's (the first setting it has); medians and ranges.

    python docs/ranks/auto/stages/paired.py docs/ranks/auto/stages/variants_*.json
"""

import json
import statistics
import sys


def main() -> None:
    for path in sys.argv[1:]:
        d = json.load(open(path))
        rows = d["rows"]
        plans = list(dict.fromkeys(r["plan"] for r in rows))
        settings = list(dict.fromkeys(r["setting"] for r in rows))
        step = {(r["plan"], r["setting"], r["build"]): r["step_s"] for r in rows}
        builds = sorted({r["build"] for r in rows})
        ref = (plans[-1], next(s for s in settings if (plans[-1], s, builds[0]) in step))
        out = []
        for p in plans:
            for s in settings:
                ratios = [step[(p, s, b)] / step[(ref[0], ref[1], b)] for b in builds if (p, s, b) in step]
                if not ratios or (p, s) == ref:
                    continue
                out.append(
                    f"{p.split('/')[-1]}/{s} over {ref[0]}/{ref[1]}: {statistics.median(ratios):.3f} "
                    f"[{min(ratios):.3f}-{max(ratios):.3f}]"
                )
        for s in settings[1:]:
            ratios = [step[(plans[0], s, b)] / step[(plans[0], settings[0], b)] for b in builds]
            out.append(
                f"{s} over {settings[0]} ({plans[0].split('/')[-1]}): {statistics.median(ratios):.3f} "
                f"[{min(ratios):.3f}-{max(ratios):.3f}]"
            )
        print(f"{d['model']}: " + "; ".join(out))


if __name__ == "__main__":
    main()
