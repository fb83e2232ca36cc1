"""Neural placement policies: a registry ``name -> class``.

Every policy is an ``nn.Module`` built as ``cls(graph, num_devices, **options)``
with ``sample(k) -> PolicySample``, ``log_prob(actions)``, ``greedy()`` and
``imitation_loss(op_devices)``; see :mod:`policies.seq2seq`. ``gnn``
(:mod:`policies.gnn`) also takes ``cluster=`` and fits any graph and cluster.
"""

from __future__ import annotations

from policies.base import PolicySample
from policies.gnn import GNNPolicy
from policies.hierarchical import HierarchicalPolicy
from policies.seq2seq import Seq2SeqPolicy

POLICIES: dict[str, type] = {
    Seq2SeqPolicy.name: Seq2SeqPolicy,
    HierarchicalPolicy.name: HierarchicalPolicy,
    GNNPolicy.name: GNNPolicy,
}

__all__ = ["POLICIES", "PolicySample", "Seq2SeqPolicy", "HierarchicalPolicy", "GNNPolicy"]
