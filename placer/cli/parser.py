"""The command line's argument parser: usage errors in one line, with a suggestion for a mistyped name.

argparse prints the whole usage block before its message; a bad option is bad
input like any other, so it gets the one line (and exit status 2) that names the
option, plus where to read more. A name close to a known one gets a suggestion:
an option (``--clustr``: did you mean --cluster?), a command or a choice.

>>> closest("--clustr", ["--cluster", "--methods", "--seed"])
'--cluster'
>>> closest("--zzqqxx", ["--cluster"]) is None
True
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

#: How alike a typo and a known name must be (difflib's ratio) to be suggested.
CUTOFF = 0.6


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name most like ``word``, if one is alike enough to be what was meant."""
    matches = difflib.get_close_matches(word, list(known), n=1, cutoff=CUTOFF)
    return matches[0] if matches else None


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors are one line, and name the mistyped option first.

    Every command's parser is one (``add_subparsers`` makes its parsers of the parent's class).
    An unknown option is reported before what it causes (a required option that seems missing),
    by the parser of the command it was given to, which knows what was meant.
    """

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if not self._commands():  # a command's own parser: what it does not know is not another parser's
            unknown = self._unknown_option(extras)
            if unknown:
                self.error(self._unknown_message(unknown))
        return namespace, extras

    def error(self, message: str):  # type: ignore[override]
        unknown = self._unknown_option(self._own_tokens())
        if unknown:  # the likely cause of whatever else went wrong
            message = self._unknown_message(unknown)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            suggestion = closest(str(value), [str(c) for c in action.choices])
            if suggestion is not None:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r} (did you mean {suggestion!r}?)")
        super()._check_value(action, value)

    def _commands(self) -> bool:
        """Whether this parser has commands (the top level), each with its own parser."""
        return any(
            isinstance(action.choices, dict)
            and all(isinstance(p, argparse.ArgumentParser) for p in action.choices.values())
            for action in self._actions
        )

    def _own_tokens(self) -> list[str]:
        """The arguments this parser was given; at the top level, those before the command's name (what follows it,
        the command's parser checks)."""
        given = getattr(self, "_given", [])
        if not self._commands():
            return given
        cut = next((k for k, token in enumerate(given) if not token.startswith("-")), len(given))
        return given[:cut]

    def _unknown_option(self, tokens: Sequence[str]) -> str | None:
        """The first of ``tokens`` that reads as an option this parser does not have, nor abbreviates."""
        for token in tokens:
            if token == "--":
                return None
            option = token.split("=", 1)[0]
            if not option.startswith("-") or len(option) < 2 or self._negative_number_matcher.match(option):
                continue
            if not any(known.startswith(option) for known in self._option_string_actions):
                return option
        return None

    def _unknown_message(self, option: str) -> str:
        suggestion = closest(option, [o for o in self._option_string_actions if o.startswith("--")])
        return f"unrecognized argument {option}" + (f": did you mean {suggestion}?" if suggestion else "")
