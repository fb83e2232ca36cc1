"""placer as Gymnasium environments, for your own agents (Stable-Baselines3, CleanRL, RLlib, TorchRL).

``import placer.gym`` registers three environments, three views of one placement
problem (:mod:`placer.gym.views`):

====================================  ==============================================================
id                                    one step
====================================  ==============================================================
``placer/PlaceAll-v0``                places every item (the paper's view: a MultiDiscrete action)
``placer/PlaceSequential-v0``         places the next item, in topological order (seq2seq decoding)
``placer/MoveItem-v0``                moves one item of the incumbent to a device (Placeto's view)
====================================  ==============================================================

Made with no arguments they place the paper's 2-layer NMT (``nmt-2``) on 1 CPU + 4
K80s (``k80x4``), scored by the simulator; ``graph=`` (a dataset item such as
``synthetic/moe-300-s0``, a zoo name, a graph file or a ``module:callable``:
:mod:`placer.gym.datasets`), ``cluster=`` and ``scorer=`` (``"sim"``,
``"measured"``, ``"local"`` or any scorer object: :mod:`placer.gym.scorers`)
choose another problem. The reward is placer's REINFORCE reward
(:mod:`placer.gym.problem`), the observation a Dict of padded arrays
(:mod:`placer.gym.observation`). :class:`EnvScorer` turns an environment back
into a scorer, so placer's own learners run through it.

>>> import gymnasium, placer.gym
>>> env = gymnasium.make("placer/PlaceAll-v0", graph="synthetic/chain-40-s0", cluster="k80x2")
>>> obs, info = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
>>> terminated, sorted(info["peak_bytes"])
(True, ['cpu:0', 'gpu:0', 'gpu:1'])
"""

from __future__ import annotations

import gymnasium

from placer.gym.env_scorer import EnvScorer
from placer.gym.views import ENV_IDS, MoveItemEnv, PlaceAllEnv, PlacementEnv, PlaceSequentialEnv

__all__ = ["ENV_IDS", "EnvScorer", "MoveItemEnv", "PlaceAllEnv", "PlaceSequentialEnv", "PlacementEnv"]

for _env_id, _cls in ENV_IDS.items():
    if _env_id not in gymnasium.registry:  # (a module imported twice under two names registers once)
        gymnasium.register(id=_env_id, entry_point=f"{_cls.__module__}:{_cls.__name__}")
del _env_id, _cls
