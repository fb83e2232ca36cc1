"""The common Result of scoring one placement, from the simulator or real devices."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "oom", "timeout", "error"]
STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "error")


@dataclass
class Result:
    """What scoring a placement returns.

    Attributes:
        step_time_s: time of one training step (simulated or median measured);
            ``inf`` when the placement did not run (status other than ``ok``).
        status: ``ok``, ``oom``, ``timeout`` or ``error``.
        message: human-readable detail for a non-ok status (e.g. the OOM device and peak).
        peak_bytes: logical device name -> peak memory in bytes.
        busy_s: device or link name (``"gpu:0->gpu:1"``) -> busy seconds.
        source: ``"sim"`` or ``"measured"`` (or another scorer's name).
        extra: anything else a scorer wants to report (per-step times, worker id...).
    """

    step_time_s: float
    status: Status = "ok"
    message: str = ""
    peak_bytes: dict[str, int] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)
    source: str = "sim"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["step_time_s"] = self.step_time_s if self.step_time_s != float("inf") else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        d = dict(d)
        if d.get("step_time_s") is None:
            d["step_time_s"] = float("inf")
        return cls(**d)
