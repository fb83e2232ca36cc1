"""The README's table of commands names every option each command has, so the lists cannot rot.

An option counts as documented when its command's row in "The command line" names it (any of its spellings,
``-o`` or ``--output``), or a ``placer <command> ...`` line quoted elsewhere in the README does (the zero-shot
options of ``place``, say), or the command's own options paragraph does (one that opens ``**... options.**
`placer <command>`'s options``: train's, whose options are too many for its row). The reverse, that every option
the README names exists, is ``test_documented_commands.py``'s.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from placer.cli import build_parser

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _row(command: str) -> str:
    rows = [line for line in README.splitlines() if line.startswith(f"| `placer {command} ")]
    rows += [line for line in README.splitlines() if line.startswith(f"| `placer {command}` ")]
    assert len(rows) == 1, f"the README's table has {len(rows)} rows for placer {command}"
    return rows[0]


def _quoted(command: str) -> str:
    """Every ``placer <command> ...`` the README quotes, joined."""
    return "\n".join(m.group(0) for m in re.finditer(rf"placer {re.escape(command)}(?![\w-])[^`\n]*", README))


def _named(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _options_paragraph(command: str) -> str:
    """The README's paragraph of ``command``'s options (``**Training options.** `placer train`'s options...``)."""
    opening = re.compile(rf"\*\*[\w ]+ options\.\*\* `placer {re.escape(command)}`'s options")
    return "\n".join(p for p in README.split("\n\n") if opening.match(p))


def undocumented(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """The options of ``command`` that neither its row, a quoted line of it nor its options paragraph names."""
    text = _row(command) + "\n" + _quoted(command) + "\n" + _options_paragraph(command)
    return [
        "/".join(a.option_strings)
        for a in parser._actions
        if a.option_strings and "--help" not in a.option_strings and not any(_named(o, text) for o in a.option_strings)
    ]


@pytest.mark.parametrize("command", sorted(_commands()))
def test_the_readme_row_of_each_command_names_all_its_options(command):
    assert undocumented(command, _commands()[command]) == []


def test_an_option_left_out_of_a_row_is_found():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster")
    parser.add_argument("-o", "--output")  # the row says -o
    parser.add_argument("--no-such-option-anywhere")
    assert undocumented("place", parser) == ["--no-such-option-anywhere"]
