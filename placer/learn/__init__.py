"""Learning placements: the training loop, its algorithms, its options, checkpoints, and pretraining.

:mod:`~placer.learn.loop` is ``placer train`` (``train(config)``), read top to
bottom like CleanRL's loop; :mod:`~placer.learn.config` its options
(:class:`~placer.learn.config.TrainConfig`, light: the command line is built from
it without loading torch); :mod:`~placer.learn.algos` reward -> reward baseline
-> advantage -> loss (REINFORCE, PPO); :mod:`~placer.learn.moves` the move search
whose moves a learned critic ranks, and :mod:`~placer.learn.move_learner` that search as
the loop's learner (``--algo moves``); :mod:`~placer.learn.scoring`,
:mod:`~placer.learn.state` and :mod:`~placer.learn.rundir` what the loop scores
with, records and writes; :mod:`~placer.learn.checkpoint` its checkpoints;
:mod:`~placer.learn.pretrain` and :mod:`~placer.learn.corpus` ``placer pretrain``.
Each module is imported where it is used.
"""
