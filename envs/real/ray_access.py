"""How the measured env's driver reaches Ray, without Ray: the token it sends, the local Ray's session directory.

:mod:`envs.real.measured` (the one module that imports ``ray``) joins a cluster
and starts a local Ray; what it decides from the environment and the file
system alone lives here.

Token authentication (Ray >= 2.52): Ray reads this machine's token from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token`` (:func:`token_source`). A client sends it only when
``RAY_AUTH_MODE=token``; the driver sets that itself when the variable is unset,
a token is at hand and the cluster asks for one (:func:`sends_token`: it refuses
a call without). A driver in token mode must not join a cluster without
authentication: its workers, started without a token, cannot call the driver
back and die at start (:func:`unasked_token_message`).

>>> sends_token({"RAY_AUTH_MODE": "disabled"}, has_token=True, cluster_asks=True)
False
>>> sends_token({}, has_token=True, cluster_asks=False)
False
>>> refused_message({"RAY_AUTH_TOKEN": "x"}).split(" (")[0]
'the Ray cluster refused the authentication token from RAY_AUTH_TOKEN'
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping

#: Longest path of an AF_UNIX socket (``sun_path`` holds 108 bytes with the NUL).
_UNIX_PATH_MAX = 107
#: What Ray appends to its temp dir for its longest socket path (a 7-digit pid).
_RAY_SOCKET_SUFFIX = len("/session_2000-01-01_00-00-00_000000_1234567/sockets/plasma_store")
_WHERE = "copy the head node's ~/.ray/auth_token here, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"


def token_source(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where Ray reads this machine's token from (None: no token)."""
    if environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return path if os.path.isfile(path) else None


def sends_token(environ: Mapping[str, str], has_token: bool, cluster_asks: bool = True) -> bool:
    """True when the driver should switch token authentication on: ``RAY_AUTH_MODE`` unset, a token at hand, and a
    cluster that asks for one (a token left by a local run must not reach a cluster without authentication)."""
    return environ.get("RAY_AUTH_MODE") is None and has_token and cluster_asks


def unasked_token_message(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why this driver cannot join a cluster without token authentication (None: it can).

    Only ``RAY_AUTH_MODE=token``, set by the user, stands in the way: such a driver accepts calls only with a
    token, and the cluster's workers have none.
    """
    if environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    return (
        "the Ray cluster does not use token authentication, and RAY_AUTH_MODE=token here (its workers could not "
        "call this driver back): unset RAY_AUTH_MODE, or start the cluster with RAY_AUTH_MODE=token"
    )


def refused_message(environ: Mapping[str, str] = os.environ) -> str:
    """Why a cluster refused this driver, and where the cluster's token must go."""
    mode = environ.get("RAY_AUTH_MODE", "")
    if mode.lower() not in ("", "token"):
        return f"the Ray cluster uses token authentication, and RAY_AUTH_MODE={mode} here (unset it, and {_WHERE})"
    source = token_source(environ)
    if source is None:
        return f"the Ray cluster uses token authentication, and this machine has no token ({_WHERE})"
    return f"the Ray cluster refused the authentication token from {source} (not the cluster's token: {_WHERE})"


def ray_temp_dir(run_dir: str | None) -> tuple[str, bool]:
    """The local Ray's session directory: ``(run_dir/ray, False)`` if Ray's socket paths under it fit
    AF_UNIX's limit, else ``(a fresh private temp dir, True)`` that the caller removes."""
    if run_dir is not None:
        path = os.path.join(os.path.abspath(run_dir), "ray")
        if len(os.fsencode(path)) + _RAY_SOCKET_SUFFIX <= _UNIX_PATH_MAX:
            os.makedirs(path, exist_ok=True)
            return path, False
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + len("/placer-ray-XXXXXXXX") + _RAY_SOCKET_SUFFIX > _UNIX_PATH_MAX:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="placer-ray-", dir=base), True  # mode 0700


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null for the block (what native code prints there; Python's sys.stderr too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


__all__ = [
    "native_stderr_silenced",
    "ray_temp_dir",
    "refused_message",
    "sends_token",
    "token_source",
    "unasked_token_message",
]
