"""Parameters that live on the host and are read on a GPU: the runtime of a plan's parameter homes.

A plan may give an op's parameters a home apart from the device the op runs on
(:attr:`graphs.plan.Placement.param_homes`). :func:`envs.real.placing.place_module`
then keeps the parameter (the *master*: the tensor the optimizer steps, with its
gradient and optimizer state) on its home, pinned where CUDA is present, and
inserts around each op that reads it (its *reader*; several readers, each with its
copy, send gradients that add up in the master's; see :func:`insert_home_copies`):

* ``fetch`` before the reader: a copy of the master on the reader's device, made on
  that device's side stream (``non_blocking`` from pinned memory; the reader's stream
  waits for it), a new leaf each step. The side stream first waits for the reader of
  the copy made two before on that device and frees that copy's memory, so at most
  two are live per device (the caching allocator reuses the block in the side
  stream's order, as FSDP2 does);
* ``release`` after the reader: records when the reader is done, and hooks the
  reader's backward, which makes the copy again first (the same window of two, in
  the backward); after the copy's gradient has been accumulated, the gradient is
  copied home on another side stream and the copy's memory is freed;
* ``forward_done`` at the end of the program: the forward's last copies (the
  window's two readers: a language model's head, read again right after the loss)
  are kept for their readers' backward, which then makes none (the copy joins the
  backward's window as one made would); those no backward reads again are freed.

A reader that reads a dense part of the master through views (``nn.MultiheadAttention``'s
packed projection split into the query's part and the keys' and values') is copied that
part only (:func:`part_read`), laid out as the view it read, and its gradient is added to
that part of the master's.

A reader inside a checkpointed block (:mod:`envs.real.checkpointing`, which sets
:data:`PHASE`) runs twice. In the block's first forward its copy is made and freed
as above, but its backward is not hooked: the block's second forward, in the
backward, runs ``fetch`` again, and that copy (on the side stream, outside the
window of two) is what the reader saves for its backward; autograd frees it after
that backward, and the gradient goes home as above.

At the end of ``backward()`` (autograd's final callback) the gradients sent home
are waited for and added to the masters' ``.grad``; an optimizer built on the
placed module's parameters then steps the masters where they live (the host's
Adam for host homes). Without CUDA (every logical device mapped to the CPU, as in
the tests) the same protocol runs with synchronous copies: every copy is a new
tensor, freed and made again, and the gradient reaches the master the same way.
:mod:`envs.sim.homes` simulates exactly this protocol.

**Stepping in the backward** (a plan's ``host_step`` ``"backward"``; :meth:`HomeRuntime.step_in_backward`
registers the user's optimizer, :func:`placer.apply.step_in_backward` is the public call). Each forward's
``fetch`` of a master that requires a gradient (with grad enabled; a checkpointed block's recompute does not
count) counts one gradient expected for that master this step: one per reader, so a master several entries share
(a tied weight, a layer applied twice, the parts of a packed projection) waits for all of them. Each gradient sent
home is queued, in the order it is sent, for one host worker thread (on CUDA with an event recorded on the out
stream after its copy home; the worker waits for that event, so it never waits for the GPU's later work). Whenever
the worker is free it takes every gradient queued so far: it adds each to its master's ``.grad`` (the whole
master, or its part), then steps together the masters that now have every gradient expected for them this step, in
one call per group of the user's optimizer: an optimizer of the user's type over those masters, with the
hyperparameters that group has at that moment and the user's optimizer's state (``optimizer.state_dict()`` holds
every parameter's). So the worker steps the masters in the order their last gradients arrive, while the backward
goes on (the host's Adam overlaps the GPU's backward), in batches of those that came home while it stepped the
last: the fixed cost of one optimizer call (about 20 us of Python for fused Adam; the host's ``step_call_s``,
:class:`envs.cluster.Device`) is paid per batch, not per master, when gradients come faster than it steps them.
What the worker did is counted per backward (:class:`HostStepCounts`, ``counts``; ``placer run`` reports it). The
gradients go home as before. At the end of ``backward()`` the final callback waits for the worker (a worker's
exception is raised there), steps on the calling thread any master that received some but not all of the gradients
expected (a reader whose output did not reach the loss), and resets the counts: ``backward()`` returns once every
master that received a gradient is stepped. The user's ``optimizer.step()`` after it then steps the rest (the
parameters on the GPU): the masters already stepped have their ``.grad`` hidden from it (a step pre-hook; a
post-hook puts them back, so they stay readable after the backward and ``zero_grad()`` clears them as usual). One
``backward()`` per ``optimizer.step()``: each backward steps the masters it reaches."""

from __future__ import annotations

import inspect
import math
import statistics
import time
import warnings
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch import nn

from graphs import PlacerError
from graphs.flops import is_alias, op_type
from graphs.ops import METADATA_OPS, base_op_name, dense, is_view_op, param_owners, param_paths

#: Which forward of a checkpointed block runs in this thread: ``"forward"`` (its first), ``"recompute"`` (its second,
#: in the backward), or None outside every block (set by :func:`envs.real.checkpointing.checkpointed`).
PHASE: ContextVar[str | None] = ContextVar("placer_checkpoint_phase", default=None)


class Streams:
    """The CUDA streams and events of one device's home copies; on another device, nothing (synchronous copies)."""

    def __init__(self, torch_device: torch.device) -> None:
        self.cuda = torch_device.type == "cuda"
        self.side = torch.cuda.Stream(torch_device) if self.cuda else None  # copies in
        self.out = torch.cuda.Stream(torch_device) if self.cuda else None  # gradients home
        self.torch_device = torch_device

    def compute(self) -> Any:
        return torch.cuda.current_stream(self.torch_device) if self.cuda else None

    def on_side(self) -> Any:
        """The context in which a copy in is made (and allocated): the side stream."""
        return torch.cuda.stream(self.side) if self.cuda else nullcontext()

    def mark(self) -> Any:
        """An event recorded on the compute stream now (None without CUDA)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.compute())
        return event

    def side_waits(self, event: Any) -> None:
        """The side stream waits for ``event`` (None: for everything on the compute stream so far)."""
        if not self.cuda:
            return
        if event is None:
            self.side.wait_stream(self.compute())
        else:
            self.side.wait_event(event)

    def compute_waits_side(self) -> None:
        if self.cuda:
            self.compute().wait_stream(self.side)


def free(t: torch.Tensor) -> None:
    """Give ``t``'s memory back (its storage resized to nothing; autograd's references to it stay valid)."""
    t.untyped_storage().resize_(0)


class Window:
    """One device's home copies in one pass (forward or backward), by reader, the newest last: at most two readers'
    copies live."""

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.live: deque[list[Any]] = deque()  # [reader, its copies, event after it (None until it is issued)]

    def add(self, reader: int, copy: torch.Tensor) -> None:
        """A copy for ``reader``; the first for a new reader first makes room: the side stream waits for the reader
        of the copies two readers before, whose memory is then freed."""
        if not self.live or self.live[-1][0] != reader:
            if len(self.live) >= 2:
                _, copies, read = self.live.popleft()
                self.streams.side_waits(read)
                for old in copies:
                    free(old)
            self.live.append([reader, [], None])
        self.live[-1][1].append(copy)

    def read(self, reader: int) -> None:
        """``reader`` has been issued: remember when its stream gets past it."""
        for entry in self.live:
            if entry[0] == reader:
                entry[2] = self.streams.mark()

    def drain(self, keep: Any = None) -> None:
        """Free every copy left, once the compute stream is past it; those ``keep(copy)`` says stay live, outside the
        window, marked kept (:meth:`HomeRuntime._refetch` then makes none)."""
        compute = self.streams.compute()
        while self.live:
            for copy in self.live.popleft()[1]:
                if compute is not None:  # however it is let go, not before the compute stream is past it
                    copy.record_stream(compute)
                if keep is not None and keep(copy):
                    copy._placer_kept = True  # type: ignore[attr-defined]
                else:
                    free(copy)


class Part(NamedTuple):
    """The part of a master one reader reads through its views (:func:`part_read`): the layout of the view it reads,
    dense (its elements fill ``offset`` to ``offset + numel`` of the master, each once)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


#: Backwards whose counts :class:`HostStepCounts` keeps (a long training run steps millions of times).
COUNTS_KEPT = 1000


@dataclass
class HostStepCounts:
    """What the host worker stepping homed parameters during the backward did (:meth:`HomeRuntime.step_in_backward`)
    in the backward under way, and one entry per backward done (``done``, the last :data:`COUNTS_KEPT`): its
    optimizer calls and the masters they stepped, the wall seconds of the worker's tasks (its waits for the
    interpreter's lock included), and how long ``backward()`` waited for the worker once autograd was done (the
    part of the host's Adam that did not overlap the backward)."""

    calls: int = 0
    stepped: int = 0
    worker_s: float = 0.0
    done: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=COUNTS_KEPT))

    def backward_done(self, waited_s: float) -> None:
        """Close the backward under way: its counts become an entry of ``done``."""
        self.done.append(
            {"calls": self.calls, "stepped": self.stepped, "worker_s": self.worker_s, "waited_s": waited_s}
        )
        self.calls, self.stepped, self.worker_s = 0, 0, 0.0

    def median(self, last: int | None = None) -> dict[str, float] | None:
        """The median of each count over the ``last`` backwards done (all: None); None before the first."""
        entries = list(self.done)[-last:] if last else list(self.done)
        if not entries:
            return None
        return {k: float(statistics.median(e[k] for e in entries)) for k in entries[0]}


class HomeRuntime(nn.Module):
    """The home copies of one placed module: its masters, and per device its streams and windows.

    A submodule of the placed module (``placer_homes``), which the inserted nodes read; it holds the masters in a
    plain list, so they stay the placed module's parameters only.
    """

    def __init__(
        self,
        masters: list[nn.Parameter],
        readers: list[int],
        torch_devices: list[torch.device],
        parts: list[Part | None] | None = None,
    ) -> None:
        super().__init__()
        self.masters = masters
        self.readers = readers  # per master, its reader (an id: a master's copies are made and freed by reader)
        self.torch_devices = torch_devices  # the reader's device, per master
        self.parts = parts or [None] * len(masters)  # per master, the part of it its reader reads (None: all of it)
        self.streams = {d: Streams(d) for d in set(torch_devices)}
        self.windows = {(d, p): Window(s) for d, s in self.streams.items() for p in (0, 1)}
        self.sent: list[tuple[int, torch.Tensor]] = []  # gradients on their way home
        self.callback_queued = False
        # stepping in the backward (step_in_backward): per entry its master's slot, one per distinct master
        slot_of: dict[int, int] = {}
        self.slots = [slot_of.setdefault(id(m), len(slot_of)) for m in masters]
        self.distinct = list({id(m): m for m in masters}.values())  # by slot
        self.expected = [0] * len(self.distinct)  # gradients expected this step, by slot (counted in fetch)
        self.arrived = [0] * len(self.distinct)  # gradients added to the master's .grad this step (by the worker)
        self.done = [False] * len(self.distinct)  # stepped in this backward
        self.host_step = "after"  # the plan's (placer.apply sets it): "backward" warns once without an optimizer
        self.keep_last = True  # the plan's home_copies is "keep-last" (placer.apply sets it): see forward_done
        self.warned = False
        self.optimizer: torch.optim.Optimizer | None = None  # the user's, registered by step_in_backward
        self.subs: dict[int, torch.optim.Optimizer] = {}  # by group of the user's: the optimizer of its masters here
        self.groups: list[int] = []  # by slot: the index of its group in the user's optimizer (-1: not stepped)
        self.stepped: set[int] = set()  # slots stepped in a backward since the user's last step()
        self.hidden: list[tuple[nn.Parameter, torch.Tensor | None]] = []  # their .grad, during the user's step()
        self.hooks: list[Any] = []  # on the user's optimizer
        self.executor: ThreadPoolExecutor | None = None  # the host worker (made on first use)
        self.futures: list[Future] = []  # this backward's tasks on it
        self.inbox: deque[tuple[int, torch.Tensor, Any]] = deque()  # gradients home, not yet taken by the worker
        self.counts = HostStepCounts()  # what the worker did, per backward

    def copy_bytes(self) -> list[int]:
        """Per master entry, the bytes of each copy made of it for its reader (all of it, or the part it reads)."""
        sizes = [math.prod(part.size) if part else m.numel() for m, part in zip(self.masters, self.parts)]
        return [n * m.element_size() for n, m in zip(sizes, self.masters)]

    def window(self, index: int, backward: bool) -> Window:
        return self.windows[(self.torch_devices[index], int(backward))]

    def fetch(self, index: int) -> torch.Tensor:
        """The copy of master ``index`` on its reader's device for this step's forward (a new leaf)."""
        if PHASE.get() == "recompute":
            return self._recompute_copy(index)
        master, window = self.masters[index], self.window(index, False)
        streams = self.streams[self.torch_devices[index]]
        with streams.on_side():
            copy = self._empty(index)
            window.add(self.readers[index], copy)  # the side stream waits before it copies
            self._fill(index, copy)
        streams.compute_waits_side()
        if master.requires_grad:
            copy.requires_grad_(True)
            copy.register_post_accumulate_grad_hook(partial(self._send_home, index))
            if torch.is_grad_enabled():  # its reader's backward sends one gradient home
                self.expected[self.slots[index]] += 1
        return copy

    def release(self, index: int, copy: torch.Tensor, output: Any) -> None:
        """After the reader of ``copy``: note it read the copy, and make the copy again before its backward (in a
        checkpointed block, the block's second forward makes it)."""
        phase = PHASE.get()
        if phase == "recompute":
            return
        self.window(index, False).read(self.readers[index])
        if phase == "forward":
            return
        grad_fn = _grad_fn(output)
        if grad_fn is None:  # no backward (its inputs take no gradient): nothing reads the copy again
            return
        grad_fn.register_prehook(lambda grad_outputs: self._refetch(index, copy))
        copy._placer_read_again = True  # forward_done may keep it for that backward  # type: ignore[attr-defined]
        if not copy.requires_grad:  # a frozen parameter: read by the backward (an input's gradient), none sent home
            reader = self.readers[index]
            grad_fn.register_hook(lambda grad_inputs, grad_outputs: self.window(index, True).read(reader))

    def forward_done(self) -> None:
        """The forward's last copies (at most two readers' per device, those its window holds): each one its reader's
        backward reads again is kept for it, not made again (:meth:`_refetch`); the others are let go. A plan whose
        ``home_copies`` is "again" (``keep_last`` False) lets every one go."""
        keep = _read_again if self.keep_last else None
        for (_, backward), window in self.windows.items():
            if not backward:
                window.drain(keep)

    def _recompute_copy(self, index: int) -> torch.Tensor:
        """The copy for the reader's second forward, in its checkpointed block's recompute: on the side stream,
        outside the window; the reader saves it for its backward, after which autograd frees it (on CUDA, once the
        compute stream is past it)."""
        master = self.masters[index]
        streams = self.streams[self.torch_devices[index]]
        with streams.on_side():
            copy = self._empty(index)
            self._fill(index, copy)
        streams.compute_waits_side()
        if streams.cuda:
            copy.record_stream(streams.compute())
        return copy.requires_grad_(master.requires_grad)

    def _empty(self, index: int) -> torch.Tensor:
        """Memory for a copy of master ``index`` on its reader's device: the master's shape, or its part's layout."""
        master, part = self.masters[index], self.parts[index]
        if part is None:
            return torch.empty_like(master, device=self.torch_devices[index])
        return torch.empty_strided(part.size, part.stride, dtype=master.dtype, device=self.torch_devices[index])

    def _fill(self, index: int, copy: torch.Tensor) -> None:
        """Copy master ``index`` (or the part its reader reads) into ``copy``'s memory, past autograd (the copy may
        be saved for a backward already), asynchronously from pinned memory on CUDA."""
        master, part = self.masters[index], self.parts[index]
        streams = self.streams[self.torch_devices[index]]
        if part is None:
            copy.untyped_storage().copy_(master.untyped_storage(), non_blocking=streams.cuda)
            return
        n = copy.numel()  # the part is dense: its elements are the master's n from its offset, as laid out in copy
        into = torch.empty(0, dtype=copy.dtype, device=copy.device).set_(copy.untyped_storage(), 0, (n,))
        into.copy_(master.detach().view(-1)[part.offset : part.offset + n], non_blocking=streams.cuda)

    def _refetch(self, index: int, copy: torch.Tensor) -> None:
        """Before the reader's backward: the copy's memory again, filled from the master on the side stream; or, for a
        copy the forward kept (:meth:`forward_done`), the copy as it is (it joins the backward's window all the
        same: the side stream waits for the reader two before and lets that one's copies go)."""
        window = self.window(index, True)
        streams = self.streams[self.torch_devices[index]]
        kept = getattr(copy, "_placer_kept", False)
        copy._placer_kept = False  # type: ignore[attr-defined]
        with streams.on_side():
            window.add(self.readers[index], copy)
            if not kept:
                copy.untyped_storage().resize_(copy.numel() * copy.element_size())
                self._fill(index, copy)
        if not kept:
            streams.compute_waits_side()
        self._queue_callback()

    def _send_home(self, index: int, copy: torch.Tensor) -> None:
        """The copy's gradient is complete: send it home on the other side stream, and let the copy go."""
        streams = self.streams[self.torch_devices[index]]
        self.window(index, True).read(self.readers[index])
        grad = copy.grad
        copy.grad = None
        master, event = self.masters[index], None
        if streams.cuda:
            streams.out.wait_stream(streams.compute())
            with torch.cuda.stream(streams.out):
                home = torch.empty(grad.shape, dtype=grad.dtype, pin_memory=True)
                home.copy_(grad, non_blocking=True)
            grad.record_stream(streams.out)
            if self.optimizer is not None:
                event = torch.cuda.Event()
                event.record(streams.out)
        else:
            home = grad.to(master.device, copy=True)
        if self.optimizer is None:
            self.sent.append((index, home))
        else:  # stepping in the backward: the host worker adds it, and steps the master once it has them all
            if self.executor is None:
                self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="placer-host-step")
            self.inbox.append((index, home, event))
            self.futures.append(self.executor.submit(self._drain))
        self._queue_callback()

    def _queue_callback(self) -> None:
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _add_home(self, index: int, grad: torch.Tensor) -> None:
        """Add a gradient that came home to master ``index``'s ``.grad`` (all of it, or the part its reader read)."""
        master, part = self.masters[index], self.parts[index]
        if part is None:
            master.grad = grad if master.grad is None else master.grad + grad
            return
        if master.grad is None:
            master.grad = torch.zeros_like(master)
        master.grad.as_strided(part.size, part.stride, part.offset).add_(grad)

    def _backward_done(self) -> None:
        """At the end of ``backward()``: the gradients are home, added to the masters (stepping in the backward:
        the worker is done, and every master that received a gradient is stepped); the copies let go."""
        self.callback_queued = False
        try:
            if self.sent:
                for streams in self.streams.values():
                    if streams.cuda:
                        streams.out.synchronize()
                for index, grad in self.sent:
                    self._add_home(index, grad)
            self._finish_steps()
        finally:
            self.sent.clear()
            self.futures.clear()
            self.inbox.clear()
            n = len(self.distinct)
            self.expected, self.arrived, self.done = [0] * n, [0] * n, [False] * n
            for (_, backward), window in self.windows.items():
                if backward:
                    window.drain()
        if self.host_step == "backward" and self.optimizer is None and not self.warned:
            self.warned = True
            warnings.warn(
                "placer: the plan steps its homed parameters in the backward (host_step 'backward'), but no "
                "optimizer is registered: call placer.apply.step_in_backward(placed, optimizer) (until then, "
                "optimizer.step() steps them)",
                stacklevel=2,
            )

    # ------------------------------------------------------------- stepping in the backward
    def step_in_backward(self, optimizer: torch.optim.Optimizer, names: Mapping[int, str] | None = None) -> int:
        """Step each master during the backward, as soon as all its gradients are home, with ``optimizer`` (the
        user's, holding the masters; see the module docstring). Returns how many masters it steps so (those that
        require a gradient). Calling it again with the same optimizer does nothing more; another replaces it.

        ``names``: ``id(master)`` -> its name, for the error a master missing from ``optimizer`` raises
        (:class:`PlacerError`), or a ``type(optimizer)`` that cannot be made for one parameter from its group.
        """
        if optimizer is self.optimizer:
            return sum(g >= 0 for g in self.groups)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise PlacerError(f"step_in_backward: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
        accepted = inspect.signature(type(optimizer).__init__).parameters
        groups: list[int] = []
        members: dict[int, list[nn.Parameter]] = {}  # by group: its masters stepped here
        for slot, master in enumerate(self.distinct):
            if not master.requires_grad:
                groups.append(-1)
                continue
            if id(master) not in group_of:
                raise PlacerError(
                    f"step_in_backward: {self._name(slot, names)} is not among the optimizer's parameters: build it "
                    "on the placed module's parameters (placed.parameters())"
                )
            groups.append(group_of[id(master)])
            members.setdefault(groups[-1], []).append(master)
        subs: dict[int, torch.optim.Optimizer] = {}
        for g, masters in members.items():
            hyper = {k: v for k, v in optimizer.param_groups[g].items() if k != "params" and k in accepted}
            try:
                subs[g] = type(optimizer)(masters, **hyper)
            except Exception as e:  # noqa: BLE001  (an optimizer type that cannot be made so)
                name = self._name(groups.index(g), names)
                raise PlacerError(
                    f"step_in_backward: {type(optimizer).__name__} cannot be made for {name} and the other homed "
                    f"parameters of its group from the group's hyperparameters: {type(e).__name__}: {e}"
                ) from e
            subs[g].state = optimizer.state  # one state: the user's optimizer's state_dict holds every parameter's
        self._unregister()
        self.optimizer, self.subs, self.groups = optimizer, subs, groups
        self.hooks = [
            optimizer.register_step_pre_hook(self._hide_stepped),
            optimizer.register_step_post_hook(self._show_stepped),
        ]
        return sum(g >= 0 for g in groups)

    def _name(self, slot: int, names: Mapping[int, str] | None) -> str:
        master = self.distinct[slot]
        return (names or {}).get(id(master), f"homed parameter {slot} {tuple(master.shape)}")

    def _unregister(self) -> None:
        """Forget the optimizer registered (its hooks removed)."""
        for hook in self.hooks:
            hook.remove()
        self.optimizer, self.subs, self.groups, self.hooks = None, {}, [], []
        self.stepped.clear()

    def _drain(self) -> None:
        """On the host worker: every gradient queued so far (each once its ``event`` is done; None: it is), added
        to its master's; then the masters that have all their expected gradients stepped together."""
        t0 = time.perf_counter()
        try:
            self._take_queued()
        finally:
            self.counts.worker_s += time.perf_counter() - t0

    def _take_queued(self) -> None:
        complete = []
        while self.inbox:
            index, grad, event = self.inbox.popleft()
            if event is not None:
                event.synchronize()
            slot = self.slots[index]
            with torch.no_grad():
                self._add_home(index, grad)
            self.arrived[slot] += 1
            if self.arrived[slot] == self.expected[slot]:
                complete.append(slot)
        self._step(complete)

    def _step(self, slots: list[int]) -> None:
        """Step the masters of ``slots`` (in order), one call per group of the user's optimizer over its masters
        among them, with the hyperparameters the group has now and the shared state."""
        if self.optimizer is None:
            return
        by_group: dict[int, list[int]] = {}
        for slot in slots:
            if slot < len(self.groups) and self.groups[slot] >= 0:
                by_group.setdefault(self.groups[slot], []).append(slot)
        for g, members in by_group.items():
            sub, group = self.subs[g], self.optimizer.param_groups[g]
            sub.param_groups[0].update({k: v for k, v in group.items() if k != "params"})  # an lr scheduler's lr
            sub.param_groups[0]["params"] = [self.distinct[slot] for slot in members]
            sub.state = self.optimizer.state  # load_state_dict replaces it
            sub.step()
            self.counts.calls += 1
            self.counts.stepped += len(members)
            for slot in members:
                self.done[slot] = True
                self.stepped.add(slot)

    def _finish_steps(self) -> None:
        """The end of a backward stepping in it: wait for the worker (its first exception raised here), then step
        every master that received gradients but was not stepped (fewer arrived than its fetches expected)."""
        error, t0 = None, time.perf_counter()
        for future in self.futures:
            e = future.exception()
            if e is not None and error is None:
                error = e
        waited_s = time.perf_counter() - t0
        if error is not None:
            raise error
        if self.optimizer is None:
            return
        self._step([slot for slot, arrived in enumerate(self.arrived) if arrived and not self.done[slot]])
        if self.futures:
            self.counts.backward_done(waited_s)

    def _hide_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Before the user's ``step()``: the masters stepped in the backward have no gradient for it."""
        masters = [self.distinct[slot] for slot in sorted(self.stepped)]
        self.hidden = [(m, m.grad) for m in masters]
        for m in masters:
            m.grad = None

    def _show_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """After it: their gradients back (readable, and ``zero_grad()`` clears them)."""
        for m, grad in self.hidden:
            m.grad = grad
        self.hidden = []
        self.stepped.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.update(executor=None, futures=[], inbox=deque())  # a thread pool does not copy; a copy makes its own
        return state


def _read_again(copy: torch.Tensor) -> bool:
    """Whether a copy's reader's backward reads it again (:meth:`HomeRuntime.release` hooked it)."""
    return getattr(copy, "_placer_read_again", False)


def _grad_fn(output: Any) -> Any:
    """The autograd node of an op's output (a tensor, or the first tensor of a tuple), or None."""
    if isinstance(output, torch.Tensor):
        return output.grad_fn
    if isinstance(output, (tuple, list)):
        return next((t.grad_fn for t in output if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    return None


def home_master(t: torch.Tensor, torch_device: torch.device) -> nn.Parameter:
    """A parameter's master on its home: a contiguous copy there (pinned on the host where CUDA is present)."""
    data = t.detach().to(torch_device).contiguous()
    if data is t:
        data = data.clone()
    if torch_device.type == "cpu" and torch.cuda.is_available():
        data = data.pin_memory()
    return nn.Parameter(data, requires_grad=t.requires_grad)


# ------------------------------------------------------------- the program's nodes
def fetch_home(runtime: HomeRuntime, index: int, master: torch.Tensor) -> torch.Tensor:
    """The node before a homed parameter's reader (``master`` keeps the data dependency in the program)."""
    return runtime.fetch(index)


def release_home(runtime: HomeRuntime, index: int, copy: torch.Tensor, output: Any) -> None:
    """The node after a homed parameter's reader."""
    runtime.release(index, copy, output)


def forward_done(runtime: HomeRuntime) -> None:
    """The node before the program's output."""
    runtime.forward_done()


#: node.meta key on the nodes :func:`insert_home_copies` adds: they are placed already.
HOME_COPY_META = "placer_home_copy"
#: node.meta key on a homed parameter's views, which :func:`insert_home_copies` moves next to their reader: they run
#: with it (in its checkpointed block too, :mod:`envs.real.checkpointing`).
HOME_VIEW_META = "placer_home_view"
RUNTIME_ATTR = "placer_homes"
#: GraphModule.meta key: the plan's ``host_step`` (:data:`graphs.plan.HOST_STEPS`), which :func:`placer.apply` records.
HOST_STEP_META = "placer_host_step"


def runtime_of(placed: nn.Module) -> HomeRuntime | None:
    """The :class:`HomeRuntime` of a placed module, or None where it has no homes."""
    runtime = getattr(placed, RUNTIME_ATTR, None) if isinstance(placed, nn.Module) else None
    return runtime if isinstance(runtime, HomeRuntime) else None


def step_in_backward(placed: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Step ``placed``'s homed parameters during ``backward()``: each as soon as all its gradients are home, on a
    host thread while the backward goes on (a plan's ``host_step`` ``"backward"``; the module docstring says how).

    ``placed`` is a module :func:`placer.apply` returned, ``optimizer`` the ``torch.optim.Optimizer`` built on its
    parameters. Each homed parameter is stepped by an optimizer of ``optimizer``'s type over it alone, with the
    hyperparameters its group in ``optimizer`` has at that moment (an lr scheduler on ``optimizer`` applies) and
    ``optimizer``'s state (its ``state_dict()`` holds every parameter's, and loads as usual). ``optimizer.step()``
    after the backward then steps the other parameters only; the homed ones keep their ``.grad`` for reading, and
    ``zero_grad()`` clears them as usual. Returns how many parameters step in the backward (0 for a module without
    homes: nothing is done). Calling it again with the same optimizer does nothing more; another replaces it::

        placed = placer.apply(model, plan, inputs)
        optimizer = torch.optim.Adam(placed.parameters(), fused=True)
        placer.apply.step_in_backward(placed, optimizer)   # homed parameters step during backward()
        loss = placed(*inputs); loss.backward(); optimizer.step(); optimizer.zero_grad()

    Caveats: one ``backward()`` per ``optimizer.step()``: each backward steps the homed parameters it reaches, so
    gradients accumulated over several backwards are not stepped together; and clipping gradients by their global
    norm (or a ``GradScaler``'s unscaling) between ``backward()`` and ``step()`` does not reach the parameters
    already stepped. Raises :class:`graphs.PlacerError` where a homed parameter that requires a gradient is not
    among ``optimizer``'s parameters.
    """
    runtime = runtime_of(placed)
    if runtime is None:
        return 0
    names = {id(p): name for name, p in placed.named_parameters()}
    return runtime.step_in_backward(optimizer, names)


def insert_home_copies(
    gm: fx.GraphModule,
    apart: dict[fx.Node, tuple[str, nn.Parameter]],
    torch_devices: Mapping[str, torch.device],
    home: dict,
) -> int:
    """Insert the nodes of the module docstring for every parameter ``apart`` from its readers (its ``get_attr`` node
    -> its owner's logical device, which its readers share, and the master); each fetched copy is on that device in
    ``home``. Returns how many copies each step's forward makes.

    Every op reading the parameter's data has a copy of its own (:func:`graphs.ops.param_paths`: a tied head, a
    layer applied twice), whose gradient is sent home and added to the master's. A parameter read through views
    (``x @ w.T``) is fetched for the op at the end of its views, which then run right before that op, on the copy:
    the copy is made, kept and made again for the backward as for a parameter that op reads itself, the
    simulator's model (:mod:`envs.sim.homes`). Where the views pick a dense part of it (:func:`part_read`), the
    copy is that part, and the views are not run. A check of its metadata (``w.to(dtype)`` exports one) is dropped:
    the master it would check lives on its home.

    Raises :class:`PlacerError` for a parameter read through a view that no op reads.
    """
    if not apart:
        return 0
    graph = gm.graph
    entries = []  # (get_attr node, device, master, reader, the views it is read through on each path)
    for node, (device, master) in apart.items():
        paths, checks = _paths(node)
        for check in checks:  # it would check the master, on its home, against the reader's device
            graph.erase_node(check)
        by_reader: dict[fx.Node, list[list[fx.Node]]] = {}
        for reader, chain in paths:
            by_reader.setdefault(reader, []).append(chain)
        entries += [(node, device, master, reader, chains) for reader, chains in by_reader.items()]
    parts = [part_read(master, node, chains) for node, _, master, _, chains in entries]
    runtime = HomeRuntime(
        [e[2] for e in entries], [id(e[3]) for e in entries], [torch_devices[e[1]] for e in entries], parts
    )
    gm.add_module(RUNTIME_ATTR, runtime)
    first = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
    with graph.inserting_before(first):
        state = graph.get_attr(RUNTIME_ATTR)
    for index, (node, device, _, reader, chains) in enumerate(entries):
        views = [view for chain in chains for view in chain]
        if parts[index] is not None:  # the copy is the view its reader reads: the views are not run
            read = views[-1]
            with graph.inserting_before(reader):
                fetched = graph.call_function(fetch_home, (state, index, node), name=f"{node.name}_fetch")
            reader.replace_input_with(read, fetched)
            for view in reversed(views):
                graph.erase_node(view)
        else:
            read = node
            for view in views:  # the views run right before their reader, on the copy (and in its checkpointed block)
                reader.prepend(view)
                view.meta[HOME_VIEW_META] = True
            with graph.inserting_before(views[0] if views else reader):
                fetched = graph.call_function(fetch_home, (state, index, node), name=f"{node.name}_fetch")
            for chain in chains:
                (chain[0] if chain else reader).replace_input_with(node, fetched)
        if "val" in read.meta:
            fetched.meta["val"] = read.meta["val"]
        with graph.inserting_after(reader):
            released = graph.call_function(release_home, (state, index, fetched, reader))
        for n in (fetched, released):
            n.meta[HOME_COPY_META] = True
        home[fetched] = device
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):
        graph.call_function(forward_done, (state,)).meta[HOME_COPY_META] = True
    return len(entries)


def part_read(master: torch.Tensor, node: fx.Node, chains: list[list[fx.Node]]) -> Part | None:
    """The part of ``master`` (parameter ``node``'s) that a reader reading it through one chain of views (``chains``,
    node order) reads, where that is a dense part smaller than the master (``nn.MultiheadAttention``'s query part of
    its packed projection: a third of it): its copy need hold no more. None where it reads all of it (``w.T``), its
    views take arguments the program computes, or it reads a part strided over the master (copied whole).

    The views are run on the master itself (they make no copy) to find the part's layout, which its copy keeps: the
    reader sees the strides it saw without homes.
    """
    if len(chains) != 1 or not chains[0] or master.device.type == "meta":
        return None
    value, at = master.detach(), node

    def arg(a: fx.Node) -> Any:
        if a is not at:
            raise LookupError(a.name)
        return value

    try:
        with torch.no_grad():
            for view in chains[0]:
                args, kwargs = fx.node.map_arg((view.args, view.kwargs), arg)
                value, at = view.target(*args, **kwargs), view
    except LookupError:  # a view of the master taking another value of the program (a size it computes)
        return None
    if not isinstance(value, torch.Tensor) or value.untyped_storage().data_ptr() != master.untyped_storage().data_ptr():
        return None
    size, stride = tuple(value.shape), tuple(value.stride())
    if not 0 < value.numel() < master.numel() or not dense(size, stride) or not master.is_contiguous():
        return None
    return Part(size, stride, value.storage_offset() - master.storage_offset())


def _is_check(node: fx.Node) -> bool:
    return base_op_name(op_type(node.target)) in METADATA_OPS


def _is_view(node: fx.Node) -> bool:
    return is_view_op(op_type(node.target)) or is_alias(node.target)  # graphs.ops.view_mask's


def _unshare_views(node: fx.Node) -> None:
    """Make every view of parameter ``node`` that several ops read (``nn.MultiheadAttention``'s packed weight split
    into the query's part and the keys' and values') once per op: each reader then reads the parameter through
    views of its own, which run on its copy (the views it shared, made again, as :func:`graphs.ops.param_paths`'
    paths repeat them)."""
    graph = node.graph
    while True:
        stack, shared = list(node.users), None
        while stack and shared is None:
            at = stack.pop()
            if at.op != "call_function" or not _is_view(at):
                continue
            users = [u for u in at.users if u.op == "call_function" and not _is_check(u)]
            if len(users) > 1:
                shared = (at, users)
            stack += users
        if shared is None:
            return
        at, users = shared
        for user in users[1:]:
            with graph.inserting_after(at):
                again = graph.node_copy(at)
            user.replace_input_with(at, again)


def _paths(node: fx.Node) -> tuple[list[tuple[fx.Node, list[fx.Node]]], list[fx.Node]]:
    """Each op that reads parameter ``node``'s data with the views it reads it through (none: it reads it itself; a
    view several ops read is made again for each, :func:`_unshare_views`), and the ops that check the metadata of the
    parameter or of those views (:data:`graphs.ops.METADATA_OPS`)."""
    _unshare_views(node)
    checks: list[fx.Node] = []

    def users_of(at: fx.Node) -> list[fx.Node]:
        users = [u for u in at.users if u.op == "call_function"]
        checks.extend(u for u in users if _is_check(u))
        return [u for u in users if not _is_check(u)]

    paths = []
    for at in users_of(node):
        chain: list[fx.Node] = []
        while _is_view(at):
            chain.append(at)
            users = users_of(at)
            if len(users) != 1:  # none (several were made one each)
                raise PlacerError(
                    f"param_homes: {node.target} is read through {at.name}, which no op reads: it stays with its ops"
                )
            at = users[0]
        paths.append((at, chain))
    return paths, checks


def homes_apart(placement: Any, graph: Any) -> dict[str, str]:
    """A plan's ``param_homes`` checked against its ``graph`` (:meth:`graphs.plan.Placement.home_indices`), less the
    homes that are their op's own device: what :func:`envs.real.placing.place_module` takes as ``homes``.

    Raises :class:`PlacerError` for a parameter with an op that reads it, or a view it is read through
    (:func:`graphs.ops.param_paths`), on another device than its owner: it lives apart only with them all there.
    """
    if not getattr(placement, "param_homes", None):
        return {}
    apart = placement.home_indices(graph) >= 0
    owners = param_owners(graph)
    out = {name: device for name, device in placement.param_homes.items() if apart[owners[name]]}
    paths = param_paths(graph) if out else {}
    if paths:
        op_devices = placement.indices(graph)
        for name in out:
            i = owners[name]
            elsewhere = [u for path in paths.get(i, ()) for u in path if op_devices[u] != op_devices[i]]
            if elsewhere:
                source = getattr(placement, "source", None) or "placement"
                raise PlacerError(
                    f"{source}: param_homes: {name} is read by {graph.names[i]} and by {graph.names[elsewhere[0]]} "
                    "(or through it), which is on another device: a parameter lives apart only with every op that "
                    "reads it, and the views it is read through, on its owner's device"
                )
    return out
