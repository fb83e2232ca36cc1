"""The simulator's fidelity against real steps, behind :mod:`bench.validate_gpu`, :mod:`bench.gpu_profile` and
:mod:`bench.calibrate_sim`.

- :mod:`~bench.fidelity.models`: the models measured, at the CPU's and the GPU's sizes (tuned and held out);
- :mod:`~bench.fidelity.runs`: one model's run: the placements, their interleaved real steps, the simulated ones;
- :mod:`~bench.fidelity.measuring`: real steps of placements in this process or in a Ray actor;
- :mod:`~bench.fidelity.metrics`: the figures of measured placements (ranks, errors, repeatability, memory, orders);
- :mod:`~bench.fidelity.contention`: the host's contention fitted on the tuned models;
- :mod:`~bench.fidelity.apply_check`: ``placer.apply``'s loss and gradients against a float64 reference;
- :mod:`~bench.fidelity.report`: a run's figures per model and group, as markdown and JSON.
"""
