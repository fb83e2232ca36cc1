"""The real runtime: a placed program on torch devices, timed training steps, the profiler, Ray.

Everything here imports torch (``ray`` only in :mod:`envs.real.measured`), so
``import envs`` does not load it; each module is imported where it is used.
"""
