"""Learning placements: ``placer train``'s learners, what they share, their options, and pretraining.

:mod:`~placer.learn.runners` is ``placer train`` (``train(config)``): it picks the
learner's runner by ``--algo`` from ``RUNNERS`` and runs it on a
:class:`~placer.learn.session.Session` (:mod:`~placer.learn.session`: what every
learner shares, its set-up, the best placement, checkpoints, the result), then
:mod:`~placer.learn.comparisons` (after the budget: the equal-budget search, the
rematch). The learners: :mod:`~placer.learn.move_runner` (``--algo moves``, the
default) runs :mod:`~placer.learn.move_search`, a move search whose moves a
learned critic ranks (its budget: :mod:`~placer.learn.search_budget`);
:mod:`~placer.learn.loop` (``--algo reinforce|ppo``) is the policy-gradient loop,
read top to bottom like CleanRL's, with :mod:`~placer.learn.algos` its reward ->
reward baseline -> advantage -> loss. :mod:`~placer.learn.config` holds the
options (:class:`~placer.learn.config.TrainConfig`, light: the command line is
built from it without loading torch); :mod:`~placer.learn.run_scorers`,
:mod:`~placer.learn.run_heuristics`, :mod:`~placer.learn.state`,
:mod:`~placer.learn.rundir`, :mod:`~placer.learn.checkpoint` and
:mod:`~placer.learn.progress` what a run scores with, compares with, records,
writes and says; :mod:`~placer.learn.pretrain` and
:mod:`~placer.learn.pretrain_corpus` are ``placer pretrain``. Each module is
imported where it is used.
"""
