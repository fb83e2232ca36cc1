"""Model definitions for the zoo (see :mod:`graphs.zoo` for sizes and op counts).

Plain ``nn.Module`` code, no downloads: each ``forward`` takes the inputs of one
training step and returns the scalar loss, so the captured graph is the whole
forward pass of a step (the simulator models the backward).
"""
