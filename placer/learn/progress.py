"""What a training run tells its user while it runs: a line per phase, then the RL phase as it goes.

Everything goes to stderr (stdout keeps the summary, or the ``--json`` document).
On a terminal the RL phase is a tqdm bar; in a file or a pipe, where a bar is a
stream of carriage returns, it is a plain line every ``every_s`` seconds. A bar
never runs past its total: a time budget's last iteration may end after the
budget, and the bar then stops at 100%.

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
    total when it counts seconds, else 30 s, bounded by :data:`PLAIN_EVERY_S`).
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
        self.last_line_s = 0.0
        self.interval_s = 30.0

    def phase(self, text: str) -> None:
        """One line saying what the run does now (or has just done)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"placer: {text}", file=self.stream)
        else:
            print(f"placer: {text}", file=self.stream, flush=True)

    def start(self, label: str, total: int, unit: str) -> None:
        """Begin the measured phase: ``total`` units (``"s"`` of a time budget, or ``"it"``)."""
        self.close()
        self.label, self.total, self.unit, self.n, self.shown_n = label, max(int(total), 1), unit, 0, 0
        self.last_line_s = time.perf_counter()
        lo, hi = PLAIN_EVERY_S
        guess = self.total / 10 if unit == "s" else 30.0
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
            print(
                f"placer: {self.label}: {self.n}/{self.total} {self.unit} ({pct}%)" + (f", {status}" if status else ""),
                file=self.stream,
                flush=True,
            )
            self.last_line_s, self.shown_n = now, self.n

    def close(self) -> None:
        """End the measured phase (the bar stays drawn at where it got)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.total = 0
