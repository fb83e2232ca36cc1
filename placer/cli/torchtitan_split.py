"""``placer export-map --torchtitan``: a plan's pipeline stages as torchtitan's ``module_fqns_per_model_part``.

Typical use::

    placer export-map best_placement.json --graph mypkg.models:build --module model --torchtitan -o split.json

writes ``{"module_fqns_per_model_part": [[...], [...]]}``: per stage of the plan (a
run of ops on one device, in its issue order), the modules it runs
(:func:`placer.distributed.module_fqns_per_model_part`), the list torchtitan's
pipeline configuration reads.
"""

from __future__ import annotations

from graphs import OpGraph
from graphs.io import write_text_atomic
from graphs.plan import Placement
from placer.cli.output import print_json, to_json
from placer.distributed import module_fqns_per_model_part


def write_split(graph: OpGraph, placement: Placement, module: str, path: str, as_json: bool) -> int:
    """Write the split to ``path`` (JSON) and say so."""
    parts = module_fqns_per_model_part(graph, placement, module)
    write_text_atomic(path, to_json({"module_fqns_per_model_part": parts}) + "\n")
    if as_json:
        print_json({"output": path, "module_fqns_per_model_part": parts})
    else:
        sizes = ", ".join(str(len(p)) for p in parts)
        print(f"wrote {path}: {len(parts)} model parts, one per stage, of {sizes} modules")
    return 0
