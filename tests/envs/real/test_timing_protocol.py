"""envs.real.timing's measurement protocol: pinned threads, the garbage collector held off, interleaved rounds."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from torch import nn

from envs.real.allocator import thread_cache_off
from envs.real.interleaved import Run, measure_interleaved, resident_bytes, summarize_blocks
from envs.real.timing import Protocol, measure_steps

CPU = {"cpu:0": torch.device("cpu")}


class Tagged(nn.Module):
    """A linear layer that logs its label on each forward (and can be told to fail)."""

    def __init__(self, label: str, log: list, fail_at: int | None = None) -> None:
        super().__init__()
        self.label, self.log, self.fail_at, self.calls = label, log, fail_at, 0
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise MemoryError("no room")
        self.log.append(self.label)
        return self.lin(x)


def run_of(module: nn.Module) -> Run:
    return Run(module, torch.optim.Adam(module.parameters(), lr=1e-3), CPU)


def test_measure_steps_under_a_protocol_pins_threads_and_cores_and_holds_the_collector_off():
    seen = []

    def loss(out):
        seen.append((torch.get_num_threads(), gc.isenabled(), sorted(os.sched_getaffinity(0))))
        return out.sum()

    model, x = nn.Linear(4, 3), (torch.randn(2, 4),)
    opt = torch.optim.Adam(model.parameters())
    threads, cores = torch.get_num_threads(), os.sched_getaffinity(0)
    core = min(cores)
    m = measure_steps(
        model,
        x,
        opt,
        CPU,
        warmup_steps=1,
        timed_steps=3,
        loss_fn=loss,
        protocol=Protocol(threads=1, cpus=(core,), warmup_s=0.0),
    )
    assert set(m) == {"step_time_s", "step_times_s", "losses", "peak_bytes", "protocol"} and len(m["step_times_s"]) == 3
    protocol = {"threads": 1, "cpus": [core], "gc_off": True, "warmup_s": 0.0, "steady_malloc": True}
    assert m["protocol"] == {**protocol, "thread_cache_off": thread_cache_off()}
    assert seen[0][:2] == (1, True)  # the warm-up step: the collector still on
    assert seen[1:] == [(1, False, [core])] * 3  # timed steps: one thread, one core, no collector
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == cores and gc.isenabled()
    # without a protocol nothing changes (the old behaviour, which the Ray harness and `placer run` use)
    seen.clear()
    m = measure_steps(model, x, opt, CPU, warmup_steps=0, timed_steps=2, loss_fn=loss)
    assert "protocol" not in m and [s[1] for s in seen] == [True, True]


@pytest.mark.slow
def test_interleaved_rounds_alternate_the_order_and_a_resumed_run_skips_what_it_has():
    log: list[str] = []
    runs = {k: run_of(Tagged(k, log)) for k in "ABC"}
    blocks = []
    out = measure_interleaved(
        runs,
        (torch.randn(2, 4),),
        rounds=3,
        steps=2,
        warmup_steps=1,
        on_block=lambda k, r, b: blocks.append((k, r, len(b["step_times_s"]))),
    )
    # warm-up A B C, then rounds A B C | C B A | A B C, two steps per block
    assert "".join(log) == "ABC" + "AABBCC" + "CCBBAA" + "AABBCC"
    assert blocks == [(k, r, 2) for r, order in enumerate(("ABC", "CBA", "ABC")) for k in order]
    for k in "ABC":
        assert out[k]["status"] == "ok" and len(out[k]["step_times_s"]) == 6 and len(out[k]["round_medians_s"]) == 3
        assert out[k]["peak_bytes"] == {}  # only CUDA devices' peaks can be told apart in one process
    # resumed with A's first two rounds and B's first measured: only the missing blocks run (after the warm-up)
    log.clear()
    done = {"A": [{"step_times_s": [1.0], "status": "ok"}] * 2, "B": [{"step_times_s": [1.0], "status": "ok"}]}
    measure_interleaved(runs, (torch.randn(2, 4),), rounds=3, steps=1, warmup_steps=1, done=done)
    assert "".join(log) == "ABC" + "C" + "CB" + "ABC"


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_run_that_fails_is_recorded_and_the_others_go_on():
    log: list[str] = []
    runs = {"ok": run_of(Tagged("ok", log)), "bad": run_of(Tagged("bad", log, fail_at=3))}
    out = measure_interleaved(runs, (torch.randn(2, 4),), rounds=3, steps=1, warmup_steps=1)
    assert out["ok"]["status"] == "ok" and len(out["ok"]["step_times_s"]) == 3
    assert (
        out["bad"]["status"] == "oom"
        and "no room" in out["bad"]["message"]
        and out["bad"]["step_time_s"] == float("inf")
    )
    assert log.count("bad") == 2  # its warm-up and round 0; round 1 raised, round 2 did not run


def test_resident_bytes_count_parameters_gradients_and_optimizer_state_once():
    model = nn.Linear(4, 3)  # 12 + 3 floats: 60 bytes
    opt = torch.optim.Adam(model.parameters())
    assert resident_bytes(model, opt, torch.device("cpu")) == 60
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    # + gradients 60, exp_avg 60, exp_avg_sq 60, and Adam's step counter: a float32 scalar per parameter
    assert resident_bytes(model, opt, torch.device("cpu")) == 60 * 4 + 2 * 4
    assert resident_bytes(model, opt, torch.device("meta")) == 0


def test_summarize_blocks_of_a_failed_run():
    s = summarize_blocks(
        [{"step_times_s": [1.0], "status": "ok"}, {"step_times_s": [], "status": "timeout", "message": "ran past 1s"}]
    )
    assert (s["status"], s["message"], s["step_time_s"]) == ("timeout", "ran past 1s", float("inf"))


def test_adam_takes_the_fused_kernels_where_every_parameter_has_them_and_steps_as_the_default_does():
    from envs.real.timing import adam

    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    fused, default = adam(a.parameters(), lr=0.1), torch.optim.Adam(b.parameters(), lr=0.1)
    assert fused.defaults["fused"] is True and not default.defaults["fused"]
    x = torch.randn(5, 4)
    for m, opt in ((a, fused), (b, default)):
        for _ in range(3):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)
    meta = adam([nn.Parameter(torch.zeros(2, device="meta"))])  # a device without the kernels: torch's default
    assert not meta.defaults["fused"]
