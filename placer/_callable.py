"""Let ``placer.train(...)`` and ``placer.apply(...)`` be calls although they are modules too.

Importing ``placer.train`` (for ``TrainConfig``) sets the package attribute
``placer.train`` to the module, shadowing any function of that name; giving the
module a ``__call__`` makes both spellings work whichever was imported first.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable


def make_module_callable(module_name: str, fn: Callable[..., Any]) -> None:
    """Make ``sys.modules[module_name](...)`` call ``fn``."""

    class _CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    sys.modules[module_name].__class__ = _CallableModule
