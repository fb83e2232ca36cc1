"""Benchmarks and report harnesses, each run from a checkout's root as ``python -m bench.<module>``; not part of the
installed product.

This package sits beside the product's packages in the source tree and is not listed in ``setup.cfg``, so ``pip
install placer`` (and the wheel) never ship it. ``python -m`` puts the working directory on the path, so the
benchmarks run from the root of a checkout; the tests find the package through pytest's ``pythonpath = .``.
``scripts/`` holds the shell entry points of the lent GPU machines (``gpu_validate.sh``, ``gpu_offload.sh``).

Entry points (each module's ``main(argv) -> int``; README's "Tests and benchmarks" lists what each measures):
:mod:`~bench.graph_layer`, :mod:`~bench.sim_throughput`, :mod:`~bench.zoo_compare`, :mod:`~bench.zoo_train`,
:mod:`~bench.reproduce_paper`, :mod:`~bench.scale`, :mod:`~bench.time_to_placement`, :mod:`~bench.budget`,
:mod:`~bench.bound_gap`, :mod:`~bench.score_order`, :mod:`~bench.module_draws`, :mod:`~bench.pipeline_plans`,
:mod:`~bench.zero_shot`, :mod:`~bench.train_throughput`, :mod:`~bench.first_hour`, :mod:`~bench.probe_imitation`,
:mod:`~bench.plot_placement`, :mod:`~bench.sim_model_delta`, :mod:`~bench.calibrate_sim`, :mod:`~bench.validate_gpu`,
:mod:`~bench.gpu_profile`, :mod:`~bench.gpu_conformance`, :mod:`~bench.gpu_offload`.

What they share: :mod:`bench.common` (comma lists, the machine line, one-line usage errors),
:mod:`bench.graph_sources` (the graphs and clusters ``--graphs`` and ``--clusters`` name), :mod:`bench.plots`;
the equal-budget benchmark's scorer and methods (:mod:`bench.budget_env`, :mod:`bench.budget_runs`), the paper's
Table 1 (:mod:`bench.table1`), the conformance corpus and its check (:mod:`graphs.models.corpus`,
:mod:`bench.conformance`), the simulator's fidelity runs (:mod:`bench.fidelity`) and the offload scenario
(:mod:`bench.offload`, :mod:`bench.offload_stages`, :mod:`bench.offload_report`, :mod:`bench.measured_rl`,
:mod:`bench.fsdp2`, :mod:`bench.host_adam`).
"""

from placer.console import start_again_if_run_as_module

# ``python -m bench.<module>`` starts itself with PYTHONHASHSEED=0 where it is unset, as the ``placer`` command does
# (graphs.hash_seed): its processes and Ray actors then export one graph of a model that iterates a set of names.
start_again_if_run_as_module()
