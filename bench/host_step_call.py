"""The fixed cost of one optimizer call on the host: what the worker stepping homed parameters during the backward
pays per batch (issue 50, :class:`envs.cluster.Device` ``step_call_s``).

A plan whose homed parameters are stepped during the backward (``host_step`` "backward", :mod:`envs.real.homes`)
has one host worker step them in batches, one ``optimizer.step()`` per batch; stepped after the backward, they
take one call in all. This measures, for ``torch.optim.Adam`` (fused, as :func:`envs.real.timing.adam` builds it;
and the foreach path), the median seconds of one ``step()`` over ``k`` parameters of ``--numel`` elements each,
for each ``k`` of ``--counts`` (the first must be 1). A call's fixed cost is what merging calls saves: stepping
``k`` parameters in ``k`` calls of one takes ``(k - 1) * call`` longer than in one call of ``k``, so
``call = (k * t(1) - t(k)) / (k - 1)``, the median over the counts above 1. The fused call's is what the host's
``step_call_s`` charges per call (its default, :data:`envs.devices.STEP_CALL_S`, came from this on the 2-core
development host). One thread, as the worker runs beside the main thread. ``placer profile`` measures the
fused call the same way (:func:`envs.real.profiler.host.time_step_call`) and a profile-calibrated cluster's host
takes it.

    python -m bench.host_step_call
    python -m bench.host_step_call --counts 1,2,4,8,16,32,64 --numel 4096 --repeats 200 --json

"""

from __future__ import annotations

import sys

from bench.common import OneLineParser, print_report
from envs.devices import STEP_CALL_S
from envs.real.profiler.fit import host_fields
from envs.real.profiler.host import ADAM_PATHS, time_step_call


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.host_step_call", description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,2,4,8,16,32", help="parameters per call (default 1,2,4,8,16,32)")
    parser.add_argument("--numel", type=int, default=4096, help="elements per parameter (default 4096)")
    parser.add_argument("--repeats", type=int, default=100, help="steps timed per count; the median (default 100)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        counts = [int(c) for c in args.counts.split(",")]
    except ValueError:
        parser.error(f"--counts {args.counts!r}: give a comma-separated list of whole numbers")
    if counts[0] != 1 or min(counts) < 1 or args.numel < 1 or args.repeats < 1:
        parser.error("--counts must start at 1; --counts, --numel and --repeats must be positive")
    results = {path: time_step_call(counts, numel=args.numel, repeats=args.repeats, path=path) for path in ADAM_PATHS}
    for r in results.values():
        r["step_call_s"] = host_fields({"step_call": r})["step_call_s"]  # as a profile-calibrated cluster takes it
    doc = {"counts": counts, "numel": args.numel, "repeats": args.repeats, "paths": results}
    doc["default_step_call_s"] = STEP_CALL_S

    def table() -> str:
        us = 1e6
        lines = ["| Adam | " + " | ".join(f"k={k} (us)" for k in counts) + " | one call's fixed cost (us) |"]
        lines.append("|---|" + "---:|" * (len(counts) + 1))
        for path, r in results.items():
            cells = " | ".join(f"{s * us:.1f}" for s in r["seconds"])
            lines.append(f"| {path} | {cells} | {r['call_s'] * us:.1f} |")
        fused = results["fused"]["step_call_s"] * us
        lines.append(
            f"\nstep_call_s of this host (the fused call's): {fused:.1f} us; the default is {STEP_CALL_S * us:.0f} us."
        )
        return "\n".join(lines)

    print_report(args.json, doc, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
