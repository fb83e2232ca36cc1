"""Models from another library none of us wrote: PyTorch Geometric's graph networks, tiny, built in code (nothing
downloaded), each ``(loss module, inputs)`` over one random graph of 64 nodes and 256 edges (node classification),
or eight graphs of 8 nodes pooled (graph classification). Their message passing gathers each edge's source node
(``index_select``) and scatters into its target (``scatter_add_``, ``scatter_reduce_``). Not tuned on.

``pyg:<name>`` with this folder on ``PYTHONPATH`` (``placer train pyg:sage ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --pyg``. Needs ``pip install torch_geometric`` (not a dependency
of placer; ``--no-deps`` with ``xxhash aiohttp`` keeps the CPU torch).

A graph's inputs are not a batch of independent samples: the edge index refers to every node, so a plan of
microbatches, which cuts the node features and gives the edge index whole to each part, cannot run them (placer
says so in one line). GCN and GAT add self loops by default through a boolean mask, a shape that depends on the
data, which capture refuses in one line; ``gcn_no_loops`` and ``gat_no_loops`` are the same layers without them.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

#: Nodes, edges, node features and classes of the graph every model trains on.
NODES, EDGES, FEATURES, CLASSES = 64, 256, 16, 5


def _graph(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(NODES, FEATURES, generator=g)
    edge_index = torch.randint(0, NODES, (2, EDGES), generator=g)
    return x, edge_index, torch.randint(0, CLASSES, (NODES,), generator=g)


class NodeClassifier(nn.Module):
    """Graph convolutions with a ReLU between each two, and the cross entropy of every node's class."""

    def __init__(self, *convs: nn.Module) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)

    def forward(self, x, edge_index, y):
        for k, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if k < len(self.convs) - 1:
                x = F.relu(x)
        return F.cross_entropy(x, y)


def gcn():
    torch.manual_seed(0)
    return NodeClassifier(gnn.GCNConv(FEATURES, 32), gnn.GCNConv(32, CLASSES)).eval(), _graph()


def gcn_no_loops():
    torch.manual_seed(0)
    convs = gnn.GCNConv(FEATURES, 32, add_self_loops=False), gnn.GCNConv(32, CLASSES, add_self_loops=False)
    return NodeClassifier(*convs).eval(), _graph()


def gat():
    torch.manual_seed(0)
    return NodeClassifier(gnn.GATConv(FEATURES, 8, heads=4), gnn.GATConv(32, CLASSES)).eval(), _graph()


def gat_no_loops():
    torch.manual_seed(0)
    convs = gnn.GATConv(FEATURES, 8, heads=4, add_self_loops=False), gnn.GATConv(32, CLASSES, add_self_loops=False)
    return NodeClassifier(*convs).eval(), _graph()


def sage():
    """GraphSAGE, its middle layer aggregating by the maximum (``scatter_reduce_`` amax, whose backward reads its
    result)."""
    torch.manual_seed(0)
    convs = gnn.SAGEConv(FEATURES, 32), gnn.SAGEConv(32, 32, aggr="max"), gnn.SAGEConv(32, CLASSES)
    return NodeClassifier(*convs).eval(), _graph()


def gin():
    torch.manual_seed(0)

    def mlp(i: int, o: int) -> nn.Module:
        return nn.Sequential(nn.Linear(i, 32), nn.ReLU(), nn.Linear(32, o))

    return NodeClassifier(gnn.GINConv(mlp(FEATURES, 32)), gnn.GINConv(mlp(32, CLASSES))).eval(), _graph()


def transformer_conv():
    torch.manual_seed(0)
    convs = gnn.TransformerConv(FEATURES, 8, heads=4), gnn.TransformerConv(32, CLASSES)
    return NodeClassifier(*convs).eval(), _graph()


class GraphClassifier(nn.Module):
    """Two graph convolutions without self loops, the mean of each graph's nodes, a linear head."""

    def __init__(self, graphs: int) -> None:
        super().__init__()
        self.graphs = graphs
        self.c1 = gnn.GraphConv(FEATURES, 32)
        self.c2 = gnn.GraphConv(32, 32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x, edge_index, batch, y):
        x = F.relu(self.c2(F.relu(self.c1(x, edge_index)), edge_index))
        return F.cross_entropy(self.head(gnn.global_mean_pool(x, batch, size=self.graphs)), y)


def graph_classifier():
    """Eight graphs of 8 nodes in one batch (PyG's ``batch`` vector), each edge within its graph."""
    torch.manual_seed(0)
    graphs, per = 8, NODES // 8
    x, edge_index, _ = _graph()
    edge_index = edge_index % per + (edge_index[0] // per) * per  # both ends in the source's graph
    batch = torch.arange(NODES) // per
    y = torch.randint(0, CLASSES, (graphs,), generator=torch.Generator().manual_seed(3))
    return GraphClassifier(graphs).eval(), (x, edge_index, batch, y)


MODELS = {f.__name__: f for f in (gcn, gcn_no_loops, gat, gat_no_loops, sage, gin, transformer_conv, graph_classifier)}
