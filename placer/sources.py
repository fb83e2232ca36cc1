"""Deprecated alias of graphs.sources (kept until the parallel branches merge).

The SOURCE resolver needs nothing above ``graphs``, so it lives there, beside the
one ``module:callable`` loader the Ray workers share: import :mod:`graphs.sources`.
"""

from graphs.sources import (  # noqa: F401
    STAND_IN_LOSS,
    describe_outputs,
    is_scalar_loss,
    load_callable,
    looks_like_callable,
    model_and_inputs,
    resolve_graph,
    resolve_graph_and_model,
    resolve_model,
    search_path,
    stand_in_loss,
    will_capture,
)
