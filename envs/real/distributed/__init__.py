"""A plan run across processes on torch's own pipeline runtime (``torch.distributed.pipelining``).

``placer.apply`` runs a plan in one process. Here the same plan runs with one
process per logical device, started by torch's launcher (torchrun, or
:func:`~envs.real.distributed.launch.launch`) or by Ray (:mod:`envs.real.ray`):

1. :mod:`~envs.real.distributed.cut`: the stages. Each maximal run of ops on one
   device, in the plan's issue order, is a stage, cut again at the plan's
   ``stage_cuts``; a device (a rank) may hold several.
2. :mod:`~envs.real.distributed.ranks`: which rank, and which local torch device,
   each logical device is.
3. :mod:`~envs.real.distributed.schedules`: the schedule. Torch's own (GPipe, 1F1B,
   Interleaved1F1B, LoopedBFS, and the zero-bubble schedules, interleaved and V, when
   a plan names them) where the plan's stages and window match one, else the plan's issue
   order as a list of actions for torch's runtime.
4. :mod:`~envs.real.distributed.rank_plan`: the three above checked against each other
   and against the graph, once, before any process starts (JSON, so it travels).
5. :mod:`~envs.real.distributed.stage_modules`: each stage as an ``fx.GraphModule`` cut
   from placer's captured program (values a later stage needs travel through the stages
   between), with the shapes torch's stages need, found without running a kernel.
6. :mod:`~envs.real.distributed.runtime`: this rank's ``PipelineStage`` objects and the
   schedule that runs them, with the gradients of parameters held by several ranks
   (tied weights) summed among those ranks.
7. :mod:`~envs.real.distributed.worker` runs in each process; :mod:`~envs.real.distributed.launch`
   starts them through ``torch.distributed.launcher`` and turns a failure into one line.
"""
