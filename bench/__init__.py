"""Benchmark and report harnesses behind ``scripts/`` — not part of the installed product.

This package sits beside ``scripts/`` in the source tree and is not listed in
``setup.cfg``, so ``pip install placer`` (and the wheel) never ship it. The scripts
put the repository root on ``sys.path`` (``python scripts/x.py`` from anywhere);
the tests find it through pytest's ``pythonpath = .``.

- :mod:`bench.common`: comma-list parsing and the machine line every script prints.
- :mod:`bench.graph_layer`: load, coarsen and capture timings (``scripts/bench_graphs.py``).
- :mod:`bench.report`: the paper's Table 1 in the simulator (``scripts/reproduce_paper.py``).
- :mod:`bench.scale`: cost of each stage vs graph size (``scripts/bench_scale.py``).
- :mod:`bench.search`: best step time vs wall time and evaluations (``scripts/bench_search.py``).
- :mod:`bench.budget`: every method at equal budgets, every simulated placement counted (``scripts/bench_budget.py``).
- :mod:`bench.plots`: the README's schedule picture and the search curves.
"""
