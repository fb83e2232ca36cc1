"""The heuristics: placement by rule or search, one module each, registered in :mod:`placer.methods.registry`.

Naive: ``single``, ``round_robin``. Practitioners': ``expert`` (the paper's
hand placement), ``gpipe``, ``accelerate*`` (:mod:`~placer.methods.heuristics.hf_accelerate`).
Partitioners: ``scotch``, ``metis``, ``kernighan_lin``. List schedulers: ``heft``,
Baechi's ``m_topo``/``m_etf``/``m_sct`` (:mod:`~placer.methods.heuristics.baechi`).
Pipeline splits (contiguous stages, for plans across processes): ``equal_layers``,
``flops_balanced``, ``parameters_balanced`` (:mod:`~placer.methods.heuristics.pipeline_splits`).
Search on the simulator: ``random_search``/``random_modules``, ``module_search``,
``annealing``; exact on coarsened groups: ``ilp`` (CP-SAT).

The pieces they share: :mod:`~placer.methods.heuristics.costs` (op costs,
memory, devices and links), :mod:`~placer.methods.heuristics.groups`
(co-location groups, snapping, linear partitions),
:mod:`~placer.methods.heuristics.scheduling` (the list schedulers' charge for
shared parameters) and :mod:`~placer.methods.heuristics.ranking` (how searches rank placements).
"""
