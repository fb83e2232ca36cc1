"""Models from another library none of us wrote: e3nn's E(3)-equivariant layers (irreducible representations,
spherical harmonics, tensor products that e3nn generates as code with ``torch.fx``), tiny, built in code (nothing
downloaded), each ``(loss module, inputs)``. Not tuned on.

- ``points``: e3nn's point-convolution network (``nn.models.v2106``'s message passing, 2 layers, ``lmax`` 2) on 4
  molecules of 8 atoms each, with the edges given (as a data loader computes them: e3nn's own ``radius_graph`` is
  ``nonzero`` on the distances, whose size is the data's); the loss is the squared error of each molecule's pooled
  output.
- ``gate_mlp``: an equivariant MLP on a batch of 32 points' features (``o3.Linear``, ``nn.Gate``, two layers).
- ``tensor_square``: ``o3.TensorSquare`` of the features then ``o3.Linear``, on the same batch.
- ``forces``: an energy model trained on its forces, ``-dE/dpos`` taken with ``torch.autograd.grad`` inside the
  forward (e3nn's interatomic potentials do this): refused at capture, in one line.

``equi:<name>`` with this folder on ``PYTHONPATH`` (``placer train equi:points ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --equi``. Needs e3nn (not a dependency of placer): ``pip install
--no-deps e3nn opt_einsum opt_einsum_fx`` (it also needs sympy and scipy, which torch and placer's extras bring).
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Molecules in a batch, atoms in each, and the cut-off radius of the edges.
MOLECULES, ATOMS, RADIUS = 4, 8, 1.6
#: Points in the feature models' batch.
POINTS = 32


def _molecules() -> tuple[torch.Tensor, ...]:
    """Positions, input features (4 scalars and a vector per atom), the edges within the radius (both ways, no self
    edge), each atom's molecule, and each molecule's target (a scalar and a vector)."""
    g = torch.Generator().manual_seed(1)
    n = MOLECULES * ATOMS
    pos = torch.randn(n, 3, generator=g)
    batch = torch.arange(MOLECULES).repeat_interleave(ATOMS)
    dist = torch.cdist(pos, pos)
    near = (dist < RADIUS) & (dist > 0) & (batch[:, None] == batch[None, :])
    src, dst = near.nonzero().T
    x = torch.randn(n, 4 + 3, generator=g)
    target = torch.randn(MOLECULES, 1 + 3, generator=g)
    return pos, x, src, dst, batch, target


class Points(nn.Module):
    """e3nn's message-passing network over given edges, pooled per molecule (``SimpleNetwork`` without its
    ``radius_graph``)."""

    def __init__(self) -> None:
        super().__init__()
        from e3nn import o3
        from e3nn.nn.models.v2106.gate_points_message_passing import MessagePassing

        self.lmax, self.basis = 2, 8
        self.irreps_sh = o3.Irreps.spherical_harmonics(self.lmax)
        hidden = o3.Irreps("8x0e + 8x0o + 4x1e + 4x1o + 2x2e + 2x2o")
        self.mp = MessagePassing(
            irreps_node_sequence=[o3.Irreps("4x0e + 1x1o"), hidden, hidden, o3.Irreps("1x0e + 1x1o")],
            irreps_node_attr="0e",
            irreps_edge_attr=self.irreps_sh,
            fc_neurons=[self.basis, 16],
            num_neighbors=3.0,
        )
        with torch.no_grad():  # e3nn starts each convolution's gate at zero (a fresh network ignores its edges):
            for name, p in self.mp.named_parameters():  # drawn here, as after some training, so the edges count
                if ".alpha." in name:
                    p.normal_(0.0, 0.5)

    def forward(self, pos, x, src, dst, batch, target):
        from e3nn import o3
        from e3nn.math import soft_one_hot_linspace

        vec = pos[src] - pos[dst]
        sh = o3.spherical_harmonics(self.irreps_sh, vec, True, normalization="component")
        length = soft_one_hot_linspace(
            vec.norm(dim=1), 0.0, RADIUS, self.basis, basis="smooth_finite", cutoff=True
        ).mul(self.basis**0.5)
        out = self.mp(x, pos.new_ones(pos.shape[0], 1), src, dst, sh, length)
        pooled = out.new_zeros(MOLECULES, out.shape[1]).index_add(0, batch, out) / ATOMS**0.5
        return F.mse_loss(pooled, target)


class Features(nn.Module):
    """A loss over an equivariant map of points' features: the squared error against a target of its irreps."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x, target):
        return F.mse_loss(self.body(x), target)


def _features(irreps_out: str) -> tuple[torch.Tensor, torch.Tensor]:
    from e3nn import o3

    g = torch.Generator().manual_seed(1)
    x = torch.randn(POINTS, o3.Irreps("8x0e + 4x1o + 2x2e").dim, generator=g)
    return x, torch.randn(POINTS, o3.Irreps(irreps_out).dim, generator=g)


def points():
    torch.manual_seed(0)
    return Points().eval(), _molecules()


def gate_mlp():
    from e3nn import o3
    from e3nn.nn import Gate

    torch.manual_seed(0)
    irreps_in = o3.Irreps("8x0e + 4x1o + 2x2e")
    layers = []
    for _ in range(2):
        gate = Gate("8x0e", [torch.tanh], "4x0e", [torch.sigmoid], "2x1o + 2x2e")
        layers += [o3.Linear(irreps_in, gate.irreps_in), gate]
        irreps_in = gate.irreps_out
    layers.append(o3.Linear(irreps_in, "2x0e + 1x1o"))
    return Features(nn.Sequential(*layers)).eval(), _features("2x0e + 1x1o")


def tensor_square():
    from e3nn import o3

    torch.manual_seed(0)
    square = o3.TensorSquare("4x0e + 2x1o + 1x2e")
    body = nn.Sequential(
        o3.Linear("8x0e + 4x1o + 2x2e", "4x0e + 2x1o + 1x2e"), square, o3.Linear(square.irreps_out, "2x0e + 1x1o")
    )
    return Features(body).eval(), _features("2x0e + 1x1o")


class Forces(nn.Module):
    """An energy from :class:`Points`' outputs (the mean of their squares: invariant); the loss is the mean square of
    its forces, ``-dE/dpos``."""

    def __init__(self) -> None:
        super().__init__()
        self.points = Points()

    def forward(self, pos, x, src, dst, batch, target):
        pos = pos.requires_grad_(True)
        from e3nn import o3
        from e3nn.math import soft_one_hot_linspace

        p = self.points
        vec = pos[src] - pos[dst]
        sh = o3.spherical_harmonics(p.irreps_sh, vec, True, normalization="component")
        length = soft_one_hot_linspace(vec.norm(dim=1), 0.0, RADIUS, p.basis, basis="smooth_finite", cutoff=True)
        energy = p.mp(x, pos.new_ones(pos.shape[0], 1), src, dst, sh, length * p.basis**0.5).pow(2).mean()
        (forces,) = torch.autograd.grad(-energy, pos, create_graph=True)
        return forces.pow(2).mean()


def forces():
    torch.manual_seed(0)
    return Forces().eval(), _molecules()


MODELS = {f.__name__: f for f in (points, gate_mlp, tensor_square, forces)}
