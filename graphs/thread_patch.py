"""One attribute of torch replaced for the calls of one thread, for a block: how capture watches or steers what a
model's code calls while it is traced (:func:`graphs.export.gradients_noted`, :func:`graphs.export.one_process_world`,
:func:`graphs.custom_functions.functions_kept`) without touching another thread's calls meanwhile."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def patched_in_this_thread(owner: Any, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """``owner.<name>`` is ``make(original)`` for the calls this thread makes through the block, the original for
    any other thread's; the original again after. A classmethod (``torch.autograd.Function.apply``) stays one: its
    function, and ``make``'s, take the class first. An attribute ``owner`` inherits (a base's classmethod) is
    replaced on ``owner``, for its subclasses' calls, and removed again after.

    >>> import math
    >>> with patched_in_this_thread(math, "floor", lambda floor: lambda x: floor(x) + 100):
    ...     math.floor(2.5)
    102
    >>> math.floor(2.5)
    2
    """
    stored = owner.__dict__.get(name)
    if stored is None:  # inherited (a method of a C base, torch._C._FunctionBase.apply): the base's, found per call
        inherited = getattr(owner, name)
        if not hasattr(inherited, "__self__"):  # a plain function: the base's function itself
            original = inherited
        else:  # a classmethod: the base's, bound to the class it is called on

            def original(cls: Any, *args: Any, **kwargs: Any) -> Any:
                return getattr(super(owner, cls), name)(*args, **kwargs)

            stored = classmethod(original)
    else:
        original = stored.__func__ if isinstance(stored, classmethod) else stored
    replacement = make(original)
    me = threading.get_ident()

    def call(*args: Any, **kwargs: Any) -> Any:
        return (replacement if threading.get_ident() == me else original)(*args, **kwargs)

    own = name in owner.__dict__
    setattr(owner, name, classmethod(call) if isinstance(stored, classmethod) else call)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, stored)
        else:
            delattr(owner, name)
