"""What a training run tells its user while it runs: a line per phase, and the measured phases as they go.

Everything goes to stderr (stdout keeps the summary, or the ``--json`` document).
On a terminal a measured phase (the learner's, the heuristics', the comparisons
after the budget) is a tqdm bar; in a file or a pipe, where a bar is a stream of
carriage returns, it is a plain line every ``every_s`` seconds, with the time
left (``ETA``) as a bar shows it. A bar never runs past its total: a time
budget's last iteration may end after the budget, and the bar then stops at 100%.

>>> import io
>>> out = io.StringIO()
>>> p = Progress(out, tty=False, every_s=0.0)
>>> p.phase("scoring 3 heuristics")
>>> p.start("training", total=10, unit="s")
>>> p.update(12, "best 1.000 ms")
>>> p.close()
>>> print(out.getvalue().strip())
placer: scoring 3 heuristics
placer: training: 10/10 s (100%), best 1.000 ms
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO, Any

from tqdm.auto import tqdm

#: A plain progress line at most this often, and at least every tenth of the phase (bounded below by it).
PLAIN_EVERY_S = (5.0, 60.0)


class Progress:
    """Progress of one run on ``stream``: :meth:`phase` lines, then one measured phase (:meth:`start` .. :meth:`close`).

    ``tty``: draw a bar (default: whether ``stream`` is a terminal).
    ``every_s``: seconds between plain lines (default: a tenth of the phase's
    total when it counts seconds, or of its ``within_s``, else 30 s, bounded by :data:`PLAIN_EVERY_S`).
    ``enabled=False`` prints nothing.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        tty: bool | None = None,
        every_s: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.enabled, self.every_s = enabled, every_s
        self.bar: Any = None
        self.label, self.total, self.unit, self.n, self.shown_n = "", 0, "", 0, 0
        self.last_line_s = self.started_s = 0.0
        self.interval_s = 30.0
        self.within_s: float | None = None

    def phase(self, text: str) -> None:
        """One line saying what the run does now (or has just done)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"placer: {text}", file=self.stream)
        else:
            print(f"placer: {text}", file=self.stream, flush=True)

    def start(self, label: str, total: int, unit: str, *, within_s: float | None = None) -> None:
        """Begin the measured phase: ``total`` units (``"s"`` of a time budget, ``"it"``, placements...).

        ``within_s``: the phase ends within this many seconds whatever its count (a search stopped at a time
        limit), so its ETA is never longer.
        """
        self.close()
        self.label, self.total, self.unit, self.n, self.shown_n = label, max(int(total), 1), unit, 0, 0
        self.last_line_s = self.started_s = time.perf_counter()
        self.within_s = within_s
        lo, hi = PLAIN_EVERY_S
        # a tenth of the phase when its length is known (a time budget, or a search's time limit), else 30 s
        guess = self.total / 10 if unit == "s" else within_s / 10 if within_s is not None else 30.0
        self.interval_s = self.every_s if self.every_s is not None else min(max(guess, lo), hi)
        if self.enabled and self.tty:
            self.bar = tqdm(
                total=self.total,
                unit=unit,
                desc=label,
                dynamic_ncols=True,
                file=self.stream,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                "[{elapsed}<{remaining}{postfix}]",
            )

    def update(self, n: float, status: str = "") -> None:
        """The phase has reached ``n`` units (clamped to its total); ``status``: what to show beside the count."""
        if not self.enabled or not self.total:
            return
        self.n = int(min(max(n, self.n), self.total))  # n may be inf: the phase is done
        if self.bar is not None:
            self.bar.set_postfix_str(status, refresh=False)
            self.bar.update(self.n - self.bar.n)
            return
        now = time.perf_counter()
        if self.n != self.shown_n and (now - self.last_line_s >= self.interval_s or self.n >= self.total):
            pct = 100 * self.n // self.total
            eta = self.eta_s(now)
            left = f", ETA {tqdm.format_interval(math.ceil(eta))}" if eta is not None else ""
            print(
                f"placer: {self.label}: {self.n}/{self.total} {self.unit} ({pct}%{left})"
                + (f", {status}" if status else ""),
                file=self.stream,
                flush=True,
            )
            self.last_line_s, self.shown_n = now, self.n

    def eta_s(self, now: float) -> float | None:
        """Seconds left in the phase at its rate so far (at most what ``within_s`` leaves); None once it is done."""
        if self.n >= self.total or self.n <= 0:
            return None
        spent = now - self.started_s
        left = spent * (self.total - self.n) / self.n
        if self.within_s is not None:
            left = min(left, max(self.within_s - spent, 0.0))
        return left

    def close(self) -> None:
        """End the measured phase (the bar stays drawn at where it got)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.total = 0


def ms(step_time_s: float | None) -> str:
    """A step time as the run's lines show it.

    >>> ms(0.2375), ms(float("inf")), ms(None)
    ('237.500 ms', 'n/a', 'n/a')
    """
    return "n/a" if step_time_s is None or not math.isfinite(step_time_s) else f"{step_time_s * 1e3:.3f} ms"
