"""Models from another library none of us wrote: torchdiffeq's neural ODEs (``odeint``, and ``odeint_adjoint``,
whose backward solves the adjoint ODE in a ``torch.autograd.Function``), tiny, built in code (nothing downloaded),
each ``(loss module, inputs)``: a classifier whose hidden state flows through an ODE from t = 0 to 1, on a batch of
16 samples of 8 features. Not tuned on.

- ``rk4``, ``euler``, ``midpoint``: fixed-step solvers (4 steps of 0.25);
- ``adjoint``: ``odeint_adjoint`` with the same RK4 steps, its gradient the adjoint ODE's solution;
- ``dopri5``: the adaptive solver, whose steps depend on the error it measures (data-dependent).

All five are refused at capture, in one line naming ``torchdiffeq/_impl/misc.py:383``: before any solve,
``odeint`` asserts that the time points are strictly monotonic (``assert diff.all() or (~diff).all()``), a value
read out of a tensor, which ``torch.export`` cannot specialise (docs/conformance/ode.log).

``ode:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --ode``. Needs torchdiffeq (not a dependency of placer): ``pip install --no-deps
torchdiffeq``.
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Batch, features, hidden width and classes.
BATCH, FEATURES, HIDDEN, CLASSES = 16, 8, 16, 3


class Dynamics(nn.Module):
    """dh/dt = f(t, h): an MLP of the state and the time."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(HIDDEN + 1, 32), nn.Linear(32, HIDDEN)

    def forward(self, t, h):
        time = t.expand(h.shape[0], 1)
        return self.b(torch.tanh(self.a(torch.cat([h, time], dim=1))))


class OdeClassifier(nn.Module):
    def __init__(self, method: str, adjoint: bool = False) -> None:
        super().__init__()
        self.encode, self.f, self.head = nn.Linear(FEATURES, HIDDEN), Dynamics(), nn.Linear(HIDDEN, CLASSES)
        self.method, self.adjoint = method, adjoint

    def forward(self, x, y):
        from torchdiffeq import odeint, odeint_adjoint

        h0 = torch.tanh(self.encode(x))
        t = torch.tensor([0.0, 1.0])
        options = {"step_size": 0.25} if self.method in ("rk4", "euler", "midpoint") else None
        if self.adjoint:
            h = odeint_adjoint(
                self.f, h0, t, method=self.method, options=options, adjoint_params=tuple(self.f.parameters())
            )
        else:
            h = odeint(self.f, h0, t, method=self.method, options=options)
        return F.cross_entropy(self.head(h[-1]), y)


def _built(method: str, adjoint: bool = False) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    return OdeClassifier(method, adjoint), (x, y)


def rk4():
    return _built("rk4")


def euler():
    return _built("euler")


def midpoint():
    return _built("midpoint")


def adjoint():
    return _built("rk4", adjoint=True)


def dopri5():
    return _built("dopri5")


MODELS = {f.__name__: f for f in (rk4, euler, midpoint, adjoint, dopri5)}
