"""Timelines of a step across processes: the real ranks' recorder, the simulator's, and the report that lays them
side by side (envs/timeline.py, envs/real/distributed/trace.py, envs/sim/ranks.py's timeline, the job report)."""

from __future__ import annotations

import json

import pytest

from envs.real.distributed.trace import ActionRecorder
from envs.real.distributed.worker import job_report, median_step
from envs.sim.ranks import RankSim
from envs.timeline import Event, chrome_trace, median_phases, phases, write_chrome_trace
from tests.envs.sim.test_ranks import cluster, two_stage_graph


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeStage:
    """What the recorder wraps on a PipelineStage: its index and the action methods the runtime calls."""

    def __init__(self, index: int, clock: Clock, fwd_s: float, bwd_s: float) -> None:
        self.stage_index, self.clock, self.fwd_s, self.bwd_s = index, clock, fwd_s, bwd_s

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None):
        self.clock.now += self.fwd_s
        return ("out", fwd_chunk_id)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        self.clock.now += self.bwd_s


class FakeOptimizer:
    def __init__(self, clock: Clock) -> None:
        self.clock, self.steps = clock, 0

    def step(self):
        self.clock.now += 0.5
        self.steps += 1


def test_the_recorder_times_each_action_from_the_step_start_and_sums_the_phases():
    clock = Clock()
    stages = [FakeStage(0, clock, 1.0, 2.0), FakeStage(2, clock, 3.0, 4.0)]
    opt = FakeOptimizer(clock)
    rec = ActionRecorder(1, stages, opt, clock=clock)
    stages[0].forward_one_chunk(0, ())  # before any step (the --check step): not recorded
    opt.step()
    for _ in range(2):  # a warm-up step, then the timed one
        rec.begin_step()
        assert stages[0].forward_one_chunk(0, ()) == ("out", 0)  # the wrapped method still returns its result
        clock.now += 0.25  # a wait between actions
        stages[1].forward_one_chunk(fwd_chunk_id=1, args=())
        stages[1].backward_one_chunk(1, loss=None)
        stages[0].backward_one_chunk(0)
        opt.step()
    assert opt.steps == 3
    out = rec.report(last=1)
    assert out["trace"] == [
        [
            [1, 0, "F", 0, 0.0, 1.0],
            [1, 2, "F", 1, 1.25, 4.25],
            [1, 2, "B", 1, 4.25, 8.25],
            [1, 0, "B", 0, 8.25, 10.25],
            [1, -1, "O", -1, 10.25, 10.75],
        ]
    ]
    assert out["phases"] == {
        "forward_s": 4.0,
        "backward_s": 6.0,
        "optimizer_s": 0.5,
        "other_s": 0.25,
        "step_s": 10.75,
    }
    assert len(rec.report(last=5)["trace"]) == 2  # only finished steps, at most as many as there are


def test_phases_take_the_rest_of_the_step_as_other_and_medians_are_per_phase():
    e = [Event(0, 0, "F", 0, 0.0, 1.0), Event(0, 0, "W", 0, 1.0, 1.5), Event(0, 0, "B", 0, 2.0, 3.0)]
    p = phases(e, 4.0)
    assert p == {"forward_s": 1.0, "backward_s": 1.5, "optimizer_s": 0.0, "other_s": 1.5, "step_s": 4.0}
    m = median_phases([p, phases(e[:1], 2.0), phases(e, 10.0)])
    assert m["step_s"] == 4.0 and m["forward_s"] == 1.0 and m["other_s"] == 1.5


def test_the_simulated_timeline_is_the_hand_timeline():
    # tests/envs/sim/test_ranks.py's GPipe case: rank 0 F0 0-1, F1 1-2, B0 10.2-12.2, B1 14.2-16.2;
    # rank 1 F0 1.6-3.6, F1 3.6-5.6, B0 5.6-9.6, B1 9.6-13.6; no parameters: optimizer steps of 0 s at the ends.
    sim = RankSim(two_stage_graph(), cluster(), microbatches=2)
    result, events = sim.timeline([0, 1])
    assert result.ok and result.step_time_s == pytest.approx(16.2)
    got = [(e.rank, e.stage, e.kind, e.microbatch, round(e.start_s, 6), round(e.end_s, 6)) for e in events]
    assert got == [
        (0, 0, "F", 0, 0.0, 1.0),
        (0, 0, "F", 1, 1.0, 2.0),
        (0, 0, "B", 0, 10.2, 12.2),
        (0, 0, "B", 1, 14.2, 16.2),
        (0, -1, "O", -1, 16.2, 16.2),
        (1, 1, "F", 0, 1.6, 3.6),
        (1, 1, "F", 1, 3.6, 5.6),
        (1, 1, "B", 0, 5.6, 9.6),
        (1, 1, "B", 1, 9.6, 13.6),
        (1, -1, "O", -1, 13.6, 13.6),
    ]
    assert sim.simulate([0, 1]).step_time_s == result.step_time_s  # the timeline changes nothing


def test_the_chrome_trace_has_a_named_row_per_rank_and_timeline(tmp_path):
    measured = [Event(0, 0, "F", 0, 0.0, 0.001), Event(1, 1, "F", 0, 0.002, 0.004)]
    simulated = [Event(0, 0, "F", 0, 0.0, 0.0005), Event(0, -1, "O", -1, 0.001, 0.002)]
    path = tmp_path / "t.json"
    write_chrome_trace(str(path), [("measured", measured), ("simulated", simulated)], {"step_time_s": 0.004})
    doc = json.loads(path.read_text())
    assert doc == chrome_trace([("measured", measured), ("simulated", simulated)], {"step_time_s": 0.004})
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "measured rank 0", 1: "measured rank 1", 1000: "simulated rank 0"}
    spans = [(e["pid"], e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert spans == [
        (0, "F0 mb0", 0.0, 1000.0),
        (1, "F1 mb0", 2000.0, 2000.0),
        (1000, "F0 mb0", 0.0, 500.0),
        (1000, "optimizer step", 1000.0, 1000.0),
    ]
    assert doc["otherData"] == {"step_time_s": 0.004}
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left


def test_the_job_report_keeps_the_timeline_of_the_median_step():
    def part(rank, times, trace):
        return {
            "rank": rank,
            "device": f"gpu:{rank}",
            "stages": [rank],
            "step_times_s": times,
            "peak_bytes": 0,
            "losses": [1.0] * len(times),
            "has_last": rank == 1,
            "phases": {"forward_s": 1.0},
            "trace": trace,
        }

    from types import SimpleNamespace

    plan = SimpleNamespace(schedule="gpipe", microbatches=1, stages=[0, 1])
    # slowest rank per step: 3, 9, 5 -> the median step is step 2
    traces = [[[[r, r, "F", 0, 0.0, float(k)]] for k in range(3)] for r in (0, 1)]
    report = job_report([part(0, [3, 1, 5], traces[0]), part(1, [2, 9, 1], traces[1])], plan, None)
    assert report["step_time_s"] == 5 and report["timeline"]["step"] == 2
    assert report["timeline"]["events"] == [[0, 0, "F", 0, 0.0, 2.0], [1, 1, "F", 0, 0.0, 2.0]]
    assert all("trace" not in r and r["phases"] == {"forward_s": 1.0} for r in report["ranks"])
    assert median_step([4.0, 1.0, 3.0, 2.0]) == 3 and median_step([]) == -1  # the lower middle of an even count


def test_a_ranks_cost_per_action_delays_its_next_action_not_its_sends():
    """The hand timeline above with 0.5 s of runtime after every action (sends of 0.6 s leave when an action ends):
    rank 0 F0 0-1, F1 1.5-2.5, B0 11.2-13.2, B1 15.7-17.7 (free 18.2); rank 1 F0 1.6-3.6, F1 4.1-6.1, B0 6.6-10.6,
    B1 11.1-15.1 (free 15.6)."""
    import dataclasses

    from envs.cluster import Cluster

    c = cluster()
    slow = Cluster("toy", [dataclasses.replace(d, action_overhead_s=0.5) for d in c.devices], c.links)
    result, events = RankSim(two_stage_graph(), slow, microbatches=2).timeline([0, 1])
    assert result.step_time_s == pytest.approx(18.2) and result.extra["rank_end_s"] == pytest.approx([18.2, 15.6])
    spans = {(e.rank, e.kind, e.microbatch): (round(e.start_s, 6), round(e.end_s, 6)) for e in events}
    assert spans[(0, "F", 1)] == (1.5, 2.5) and spans[(1, "F", 1)] == (4.1, 6.1)
    assert spans[(1, "B", 1)] == (11.1, 15.1) and spans[(0, "B", 0)] == (11.2, 13.2)
    assert spans[(0, "B", 1)] == (15.7, 17.7) and spans[(0, "O", -1)] == (18.2, 18.2)
    # written to and read from a cluster file; a negative one refused
    again = Cluster.from_dict(json.loads(json.dumps(slow.to_dict())))
    assert [d.action_overhead_s for d in again.devices] == [0.5, 0.5]
    assert "action_overhead_s" not in json.dumps(c.to_dict())  # written only when set
    doc = slow.to_dict()
    doc["devices"][0]["action_overhead_s"] = -1.0
    with pytest.raises(Exception, match="action_overhead_s"):
        Cluster.from_dict(doc)


class FakeWork:
    """A posted receive: waiting on it takes the clock to when its data came."""

    def __init__(self, clock: Clock, log: list, name: str, arrives: float) -> None:
        self.clock, self.log, self.name, self.arrives = clock, log, name, arrives

    def wait(self) -> None:
        self.log.append(("wait", self.name))
        self.clock.now = max(self.clock.now, self.arrives)


class ReceivingStage(FakeStage):
    """A stage after the first: each microbatch's forward receives one tensor, each backward one gradient."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(1, clock, 1.0, 2.0)
        self.asked, self.cleared = [], 0

    def get_fwd_recv_ops(self, chunk):
        self.asked.append(("f", chunk))
        return [("recv-f", chunk)]

    def get_bwd_recv_ops(self, chunk):
        self.asked.append(("b", chunk))
        return []  # the last stage: its gradients start here

    def clear_runtime_states(self):
        self.cleared += 1


def test_receives_posted_early_all_go_out_at_the_first_ask_and_the_recorder_times_only_the_compute(monkeypatch):
    """Gloo moves a message once both sides posted it: every receive of a step is posted as the step begins."""
    from envs.real.distributed import runtime

    clock, log = Clock(), []
    posts = []

    def batch_isend_irecv(ops):
        posts.append(list(ops))
        return [FakeWork(clock, log, f"{op[0]}{op[1]}", arrives=100.0 + 5.0 * (op[1] + 1)) for op in ops]

    monkeypatch.setattr(runtime.dist, "batch_isend_irecv", batch_isend_irecv)
    stage = ReceivingStage(clock)
    runtime.post_receives_early(stage, microbatches=3)
    rec = ActionRecorder(1, [stage], FakeOptimizer(clock), clock=clock)
    for _ in range(2):
        clock.now = 100.0
        stage.clear_runtime_states()  # what torch's schedule does at each step's start
        rec.begin_step()
        for m in range(3):
            assert stage.get_fwd_recv_ops(m) == []  # nothing left for the schedule to post or wait on
            if m == 0:  # the first ask posted every microbatch's receive, in order
                assert posts[-3:] == [[("recv-f", 0)], [("recv-f", 1)], [("recv-f", 2)]]
            stage.forward_one_chunk(m, ())
        for m in range(3):
            assert stage.get_bwd_recv_ops(m) == []
            stage.backward_one_chunk(m)
    assert stage.cleared == 2 and len(posts) == 6  # 3 receives a step, posted anew each step
    assert [a for a in stage.asked if a[0] == "f"] == [("f", 0), ("f", 1), ("f", 2)] * 2
    # each forward waited for its own data first (arriving at 105, 110, 115), and the recorder timed the compute
    events = rec.steps[-1]
    assert [(e.kind, e.microbatch, e.start_s, e.end_s) for e in events[:3]] == [
        ("F", 0, 5.0, 6.0),
        ("F", 1, 10.0, 11.0),
        ("F", 2, 15.0, 16.0),
    ]
    assert log[:3] == [("wait", "recv-f0"), ("wait", "recv-f1"), ("wait", "recv-f2")]


class MessagingStage:
    """A stage of a chain of ``n`` stages: one tensor out and in each way per microbatch (ops as torch builds them,
    untagged)."""

    def __init__(self, index: int, n: int) -> None:
        self.stage_index, self.n = index, n

    def _ops(self, kind, peer_stage, chunk):
        from types import SimpleNamespace

        ok = 0 <= peer_stage < self.n
        return [SimpleNamespace(kind=kind, stage=self.stage_index, peer=peer_stage, chunk=chunk, tag=0)] if ok else []

    def get_fwd_recv_ops(self, chunk):
        return self._ops("recv", self.stage_index - 1, chunk)

    def get_bwd_recv_ops(self, chunk):
        return self._ops("recv", self.stage_index + 1, chunk)

    def get_fwd_send_ops(self, chunk):
        return self._ops("send", self.stage_index + 1, chunk)

    def get_bwd_send_ops(self, chunk):
        return self._ops("send", self.stage_index - 1, chunk)


def test_tagged_streams_match_a_looped_plans_receives_posted_early_to_their_own_messages():
    """A looped plan on 2 ranks: rank 1 gets stage 0's activations and stage 2's gradients (and stage 2's
    activations) from rank 0. Gloo matches by (peer, tag) in posting order; with torch's untagged ops the receives
    posted early take the wrong messages, with a tag per stream each takes its own."""
    from envs.real.distributed.runtime import tag_streams

    def matched(tagged: bool):
        stages = [MessagingStage(s, 4) for s in range(4)]
        rank = [s % 2 for s in range(4)]
        if tagged:
            for st in stages:
                tag_streams(st)
        M = 4
        # rank 0 sends in an interleaved schedule's order (two microbatches through stage 0, then through stage 2,
        # and so on; then the backwards likewise); rank 1 posts each kind's receives at its first ask, all M at
        # once, as post_receives_early does
        rounds = [(0, 1), (2, 3)]
        sends = [op for ms in rounds for s in (0, 2) for m in ms for op in stages[s].get_fwd_send_ops(m)]
        sends += [op for ms in rounds for s in (2, 0) for m in ms for op in stages[s].get_bwd_send_ops(m)]
        recvs = [op for s in (1, 3) for m in range(M) for op in stages[s].get_fwd_recv_ops(m)]
        recvs += [op for s in (3, 1) for m in range(M) for op in stages[s].get_bwd_recv_ops(m)]
        recvs = [r for r in recvs if rank[r.peer] == 0]
        queues: dict[int, list] = {}
        for op in sends:
            if rank[op.peer] == 1:
                queues.setdefault(op.tag, []).append(op)
        pairs = [(queues[r.tag].pop(0), r) for r in recvs]
        return all((s.stage, s.peer, s.chunk) == (r.peer, r.stage, r.chunk) for s, r in pairs)

    assert not matched(tagged=False)  # posted early without tags: wrong messages
    assert matched(tagged=True)
