"""Ray's side of placer beside the measured env: a plan across processes measured as one Ray job.

:mod:`~envs.real.ray.jobs` holds :class:`~envs.real.ray.jobs.RanksEnv`, the measured env
whose every placement runs as a job of one process per device (a placement group of
rank actors, the process group set up among them). The package may import ``ray``,
as :mod:`envs.real.measured` does (``tests/test_layering.py``); nothing else does.
"""
