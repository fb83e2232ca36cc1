"""Pretrained network files: a tensor-only ``.pt`` (a state dict) plus a JSON sidecar; the gnn policy and the move
critic.

``policy.pt`` holds only the :class:`policies.gnn.GNNNet` state dict, written
with ``torch.save`` through :func:`graphs.io.write_atomic` and read with
``torch.load(weights_only=True)``: nothing in it is unpickled as code.
``policy.json`` (same name, ``.json``) describes it::

    {"format": "placer-policy/1", "policy": "gnn",
     "architecture": {"hidden": 64, "rounds": 3, "logit_cap": 10.0, "decoder": "schedule"},
     "features": {"version": "gnn-features/1", ...},
     "clusters": ["k80x4", ...], "corpus": [...], "excluded": [...],
     "seed": 0, "date": "...", "training": {...}}

A bad pair (missing sidecar, wrong format, an architecture the weights do not
fit, features of another version) raises :class:`graphs.PlacerError` with one
line naming the file. The policy shipped with the package is
``policies/pretrained/gnn-default.pt`` (see :data:`DEFAULT_POLICY`).

A move critic (:class:`policies.moves.MoveCritic`, ``"policy": "critic"``) is
stored the same way (:func:`save_critic`, :func:`load_critic`); its sidecar's
``architecture`` is ``{"hidden": ...}`` and its ``features`` the move features'
version and width (:func:`policies.moves.feature_spec`). The critic shipped
with the package, pretrained across graphs, is ``policies/pretrained/critic-default.pt``
(:data:`DEFAULT_CRITIC`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from graphs import PlacerError
from graphs.io import read_json, write_atomic, write_text_atomic
from policies.gnn import DECODERS, GNNNet
from policies.gnn_features import feature_spec
from policies.moves import MoveCritic
from policies.moves import feature_spec as move_feature_spec

FORMAT = "placer-policy/1"
DEFAULT_POLICY = str(Path(__file__).resolve().parent / "pretrained" / "gnn-default.pt")
DEFAULT_CRITIC = str(Path(__file__).resolve().parent / "pretrained" / "critic-default.pt")
_ARCH = {"hidden": (int, 1, 4096), "rounds": (int, 0, 64), "logit_cap": (float, 1e-3, 1e6)}
_REQUIRED = ("format", "policy", "architecture", "features", "clusters", "corpus", "seed", "date")


class PolicyFile(NamedTuple):
    net: Any  # policies.gnn.GNNNet with the weights loaded
    sidecar: dict[str, Any]
    path: str


def sidecar_path(path: str | os.PathLike) -> str:
    """``x/policy.pt`` -> ``x/policy.json``."""
    base, ext = os.path.splitext(os.fspath(path))
    return (base if ext == ".pt" else os.fspath(path)) + ".json"


def check_sidecar(doc: Any, where: str) -> dict[str, Any]:
    """The sidecar ``doc`` if it is a valid placer-policy/1 document, else PlacerError naming ``where``."""
    if not isinstance(doc, dict):
        raise PlacerError(f"{where}: not a policy sidecar (expected a JSON object)")
    if doc.get("format") != FORMAT:
        raise PlacerError(f"{where}: format {doc.get('format')!r}, expected {FORMAT!r}")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise PlacerError(f"{where}: missing field(s) {', '.join(missing)}")
    if doc["policy"] != "gnn":
        raise PlacerError(f"{where}: policy {doc['policy']!r}: only 'gnn' policies can be pretrained")
    arch = doc["architecture"]
    if not isinstance(arch, dict) or set(arch) - {"decoder"} != set(_ARCH):
        raise PlacerError(f"{where}: architecture must have the fields {', '.join(_ARCH)} (and optionally decoder)")
    if "decoder" in arch:  # absent in files written before the schedule decoder: independent
        if arch["decoder"] not in DECODERS:
            raise PlacerError(
                f"{where}: architecture.decoder {arch['decoder']!r}: must be one of {', '.join(DECODERS)}"
            )
        arch = {k: v for k, v in arch.items() if k != "decoder"}
    for key, (typ, low, high) in _ARCH.items():
        v = arch[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (typ is int and not isinstance(v, int))
            or not low <= v <= high
        ):
            raise PlacerError(
                f"{where}: architecture.{key} {v!r}: must be a{'n integer' if typ is int else ' number'} in "
                f"[{low}, {high}]"
            )
    if doc["features"] != feature_spec():
        raise PlacerError(
            f"{where}: features {json.dumps(doc['features'])[:120]} do not match this placer's "
            f"({feature_spec()['version']}); retrain with `placer pretrain`"
        )
    if not (isinstance(doc["clusters"], list) and all(isinstance(c, str) for c in doc["clusters"])):
        raise PlacerError(f"{where}: clusters must be a list of names")
    if not isinstance(doc["corpus"], list):
        raise PlacerError(f"{where}: corpus must be a list")
    return doc


def save(path: str | os.PathLike, net: Any, sidecar: dict[str, Any]) -> None:
    """Write ``net``'s state dict to ``path`` and the sidecar beside it (both atomically)."""
    path = os.fspath(path)
    arch = {**sidecar.get("architecture", {}), "decoder": net.decoder}  # the decoder the weights are for
    doc = check_sidecar({"format": FORMAT, "policy": "gnn", **sidecar, "architecture": arch}, sidecar_path(path))
    state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    write_atomic(path, lambda f: torch.save(state, f))
    write_text_atomic(sidecar_path(path), json.dumps(doc, indent=1, sort_keys=True))


def _pair(path: str | os.PathLike | None, default: str, what: str) -> tuple[str, str]:
    """``(weights, sidecar)`` paths of a network file (``default`` if None), both there; else PlacerError."""
    path = os.fspath(path) if path is not None else default
    if not os.path.isfile(path):
        raise PlacerError(
            f"{path}: no such {what} file"
            + (f" (the package was built without its pretrained {what})" if path == default else "")
        )
    side = sidecar_path(path)
    if not os.path.isfile(side):
        raise PlacerError(f"{path}: its sidecar {side} is missing (a {what} file needs both)")
    return path, side


def _weights(path: str, map_location: str) -> dict[str, torch.Tensor]:
    """The tensor-only state dict in ``path``, read with ``weights_only=True``; PlacerError naming the file."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated, not a torch file, or pickled objects weights_only refuses
        raise PlacerError(
            f"{path}: cannot read policy weights ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PlacerError(f"{path}: not a tensor-only state dict")
    return state


def load(path: str | os.PathLike | None = None, *, map_location: str = "cpu") -> PolicyFile:
    """Load a policy file (default: the shipped one) and its sidecar; PlacerError on any problem."""
    path, side = _pair(path, DEFAULT_POLICY, "policy")
    doc = check_sidecar(read_json(side), side)
    state = _weights(path, map_location)
    net = GNNNet(**{"decoder": "independent", **doc["architecture"]})  # files from before the schedule decoder
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise PlacerError(
            f"{path}: weights do not fit the architecture in {side} ({str(e).splitlines()[0][:200]})"
        ) from None
    return PolicyFile(net, doc, path)


# ------------------------------------------------------------------ the move critic
_CRITIC_REQUIRED = ("format", "policy", "architecture", "features", "corpus", "seed", "date")


def check_critic_sidecar(doc: Any, where: str) -> dict[str, Any]:
    """The sidecar ``doc`` if it describes a move critic this placer can read, else PlacerError naming ``where``."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlacerError(f"{where}: not a critic sidecar (format {FORMAT!r} expected)")
    missing = [k for k in _CRITIC_REQUIRED if k not in doc]
    if missing:
        raise PlacerError(f"{where}: missing field(s) {', '.join(missing)}")
    if doc["policy"] != "critic":
        raise PlacerError(f"{where}: policy {doc['policy']!r}: not a move critic")
    hidden = doc["architecture"].get("hidden") if isinstance(doc["architecture"], dict) else None
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not 1 <= hidden <= 4096:
        raise PlacerError(f"{where}: architecture.hidden {hidden!r}: must be an integer in [1, 4096]")
    if doc["features"] != move_feature_spec():
        raise PlacerError(
            f"{where}: features {json.dumps(doc['features'])[:120]} do not match this placer's move features "
            f"({json.dumps(move_feature_spec())}); pretrain the critic again (python -m bench.critic_pretrain)"
        )
    if not isinstance(doc["corpus"], list):
        raise PlacerError(f"{where}: corpus must be a list")
    return doc


def save_critic(path: str | os.PathLike, critic: MoveCritic, sidecar: dict[str, Any]) -> None:
    """Write ``critic``'s state dict to ``path`` and its sidecar beside it (both atomically)."""
    path = os.fspath(path)
    doc = {
        "format": FORMAT,
        **sidecar,
        "policy": "critic",
        "architecture": {"hidden": critic.hidden},
        "features": move_feature_spec(),
    }
    doc = check_critic_sidecar(doc, sidecar_path(path))
    # each tensor its own storage (a fitted critic's weights are views of one flat tensor: CriticFit)
    state = {k: v.detach().cpu().clone(memory_format=torch.contiguous_format) for k, v in critic.state_dict().items()}
    write_atomic(path, lambda f: torch.save(state, f))
    write_text_atomic(sidecar_path(path), json.dumps(doc, indent=1, sort_keys=True))


class CriticFile(NamedTuple):
    critic: MoveCritic  # with the weights loaded
    sidecar: dict[str, Any]
    path: str


def load_critic(path: str | os.PathLike | None = None) -> CriticFile:
    """Load a move critic file (default: the shipped one) and its sidecar; PlacerError on any problem."""
    path, side = _pair(path, DEFAULT_CRITIC, "critic")
    doc = check_critic_sidecar(read_json(side), side)
    critic = MoveCritic(doc["architecture"]["hidden"])
    try:
        critic.load_state_dict(_weights(path, "cpu"))
    except RuntimeError as e:
        raise PlacerError(
            f"{path}: weights do not fit the architecture in {side} ({str(e).splitlines()[0][:200]})"
        ) from None
    return CriticFile(critic, doc, path)
