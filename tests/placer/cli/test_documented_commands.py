"""Every command line the README and the ``--help`` texts quote names real commands and options, and runs.

A quoted command is one of:

* a *synopsis* (``placer train SOURCE --cluster C [--resume]``: metavars, brackets, alternatives): its
  command and every option it names must exist;
* a *runnable* line (``placer export mymodels:build -o g.json``): run in order, in one working directory
  holding the README's ``mymodels.py``, as a user would, in this process (``placer.cli.main``; the zoo's
  captures are the test session's; a line quoted again as written runs once). What would take minutes is kept
  tiny, and only that: a training run gets ``--time-budget 1`` and three fast heuristics to start from,
  ``compare`` with every method gives ``ilp`` 0.5 s and the searches 100 placements (annealing 200 steps,
  ``stage_search`` one round of cut moves), ``run`` times 2 steps, ``profile`` times each thing once, and
  ``pretrain`` (a corpus of graphs) stops once its arguments are checked;
* any other program (``python -m bench.X``, or a ``python X.py``: its ``--help`` runs, in this
  process; ``bash .ci/run``: the file exists).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from placer.cli import build_parser, main
from tests.conftest import importable_module

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
METAVAR = re.compile(r"^([A-Z][A-Z0-9_]*|K=V|\[?[A-Z]+\.\]?K=V)$")
PLACEHOLDER = re.compile(r"(^|[^A-Za-z0-9])[A-Z][A-Z0-9]*_[A-Z0-9_]+([^A-Za-z0-9]|$)")  # HEAD_IP: yours to fill in


def _parts(line: str) -> list[str]:
    """The commands of one shell line: ``a && b`` is two; a trailing ``# comment`` is dropped."""
    line = re.split(r"\s+#\s", line)[0].strip()
    return [p.strip() for p in line.split("&&") if p.strip()]


def readme_commands() -> list[tuple[str, bool]]:
    """``(command, in a block)`` for the command lines the README quotes, in order: shell blocks, indented
    blocks and inline code (``placer <command>`` alone in running text names the command; it is not run)."""
    found: list[tuple[int, str, bool]] = []
    fence, offset = None, 0
    for line in README.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("bash", "sh", ""):
            found += [(offset, p, True) for p in _parts(line)]
        elif fence is None:
            if line.startswith("    ") and line.strip():
                found += [(offset, p, True) for p in _parts(line)]
            found += [
                (offset + m.start(), p, False)
                for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", line)
                for p in _parts(m.group(1))
            ]
        offset += len(line)
    programs = re.compile(r"^(OMP_NUM_THREADS=\d+ )?(placer|python3?(\.\d+)?|pip|bash|tensorboard|\.) ")
    return [(c, block) for _, c, block in sorted(found, key=lambda x: x[0]) if programs.match(c + " ")]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_commands() -> list[tuple[str, bool]]:
    """``(command, a session line)`` for the command lines ``placer --help`` and every command's ``--help`` quote."""
    parser = build_parser()
    texts = [parser.format_help()] + [p.format_help() for p in _subparsers(parser).values()]
    out = []
    for text in texts:
        out += [(p, True) for line in text.splitlines() if line.strip().startswith("placer ") for p in _parts(line)]
        out += [(p, False) for m in re.finditer(r"`(placer [^`]+)`", text) for p in _parts(m.group(1))]
    return out


def runnable(command: str, in_block: bool) -> bool:
    """Whether a quoted command is meant to be run as it is (not a synopsis, nor a command named in passing)."""
    words = command.split()
    return (
        command.startswith(("placer ", "OMP_NUM_THREADS"))
        and not is_synopsis(command)
        and (in_block or len(words) > 2 or words[-1].startswith("-"))
    )


def is_synopsis(command: str) -> bool:
    """A command's form rather than a command: brackets, alternatives, ``...`` or a metavar (``SOURCE``, ``k=M``,
    ``HEAD_IP:6379``)."""
    return any(s in command for s in ("[", "\\|", "|", "...")) or any(
        METAVAR.match(t) or METAVAR.match(t.rpartition("=")[2]) or PLACEHOLDER.search(t) for t in command.split()[2:]
    )


def _tokens(command: str) -> list[str]:
    return shlex.split(command.replace("\\|", "|"))


def _quoted() -> list[str]:
    return sorted({c for c, _ in readme_commands() + help_commands() if c.startswith("placer ")})


def test_the_readme_and_the_help_texts_quote_commands():
    readme = [c for c, _ in readme_commands()]
    main_job = "placer train nmt-2 --cluster k80x4 --time-budget 300"
    assert main_job in readme and readme.index(main_job) < readme.index("placer export mymodels:build -o g.json")
    assert ("placer simulate nmt2.json runs/nmt2/best_placement.json --cluster k80x4", True) in help_commands()
    assert sum(runnable(c, b) for c, b in readme_commands()) >= 10


@pytest.mark.parametrize("command", _quoted())
def test_every_quoted_command_and_option_exists(command):
    parser = build_parser()
    commands = _subparsers(parser)
    tokens = _tokens(command)
    if tokens[1].startswith("-"):
        assert tokens[1] in parser._option_string_actions, command
        return
    assert tokens[1] in commands, f"{command}: no command {tokens[1]!r}"
    sub = commands[tokens[1]]
    for t in tokens[2:]:
        option = t.split("=")[0].strip("[]")
        if option.startswith("--"):
            assert option in sub._option_string_actions, f"{command}: {tokens[1]} has no option {option}"


# ---------------------------------------------------------------- running them
class _Checked(Exception):
    """Raised where a command's arguments are all checked and the minutes of work would begin."""


#: The heuristics a quoted training run starts from here (all of them take a minute on nmt-2).
TINY_HEURISTICS = "single,m_topo,m_etf"


def _tiny(tokens: list[str]) -> list[str]:
    """The command kept tiny where it would take minutes (see the module's docstring); otherwise as written."""
    command = tokens[1]
    if command == "train":
        if "--time-budget" in tokens:
            tokens[tokens.index("--time-budget") + 1] = "1"
        elif "--iterations" not in tokens:
            tokens += ["--time-budget", "1"]
        if "--heuristics" not in tokens:
            tokens += ["--heuristics", TINY_HEURISTICS]
    if command == "compare" and "--methods" not in tokens:
        tokens += ["--option", "ilp.time_limit_s=0.5", "--option", "n=100", "--option", "annealing.steps=200"]
        tokens += ["--option", "stage_search.rounds=1"]
    if command == "run":
        tokens += ["--steps", "2", "--warmup", "1"]
    if command == "profile" and "--repeats" not in tokens:  # each timing once (the fit is checked elsewhere)
        tokens += ["--repeats", "1", "--warmup", "0"]
    return tokens


def _run_placer(command: str, monkeypatch) -> tuple[int, str, str]:
    """``command`` as a user would run it here (a ``> file`` redirect included), in this process."""
    command, _, redirect = command.partition(" > ")
    tokens = _tokens(command)
    env = {}
    while "=" in tokens[0]:  # VAR=value placer ...
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if tokens[1] == "pretrain":
        import placer.learn.pretrain

        def checked(config):
            raise _Checked(config)

        monkeypatch.setattr(placer.learn.pretrain, "pretrain", checked)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(_tiny(tokens)[1:])
        except _Checked:
            rc = 0
        except SystemExit as e:  # --help
            rc = int(e.code or 0)
    if redirect:
        Path(redirect.strip()).write_text(out.getvalue())
    return rc, out.getvalue(), err.getvalue()


#: ``python -m`` modules the fresh-clone check runs as written (installs, the test suite), not here.
NOT_RUN_HERE = ("venv", "pytest", "pip", "placer")


def _run_other(command: str, monkeypatch) -> None:
    """What is not a placer command: a script's or a module's --help runs, a file it names exists; installs are the
    fresh clone's."""
    tokens = _tokens(command)
    program = tokens[0]
    if program.startswith("python") and len(tokens) > 1 and tokens[1].endswith(".py"):
        assert _help_runs(lambda: runpy.run_path(str(ROOT / tokens[1]), run_name="__main__"), monkeypatch), command
    elif program.startswith("python") and tokens[1:2] == ["-m"] and tokens[2] not in NOT_RUN_HERE:
        assert _help_runs(lambda: runpy.run_module(tokens[2], run_name="__main__", alter_sys=True), monkeypatch), (
            command
        )
    elif program == "bash":
        assert (ROOT / tokens[1]).is_file(), command
    # pip, venvs, pytest and tensorboard: the fresh-clone check runs those (README's install lines as written)


def _help_runs(run, monkeypatch) -> bool:
    """Whether ``run`` (a script or module run as ``__main__`` with ``--help``) prints its help and exits 0."""
    monkeypatch.setattr(sys, "argv", ["prog", "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # (a script may put its directory first)
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        run()
    return e.value.code in (0, None) and "usage:" in out.getvalue()


@pytest.fixture
def session(tmp_path, monkeypatch, zoo_cache):
    """The README's working directory: its mymodels.py, and a placement of it for the commands that take one."""
    block = re.search(r"```python\n(# mymodels\.py\n.*?)```", README.read_text(), re.S)
    assert block, "the README shows mymodels.py"
    return importable_module(tmp_path, monkeypatch, "mymodels", block.group(1))


def _run_all(commands: list[tuple[str, bool]], monkeypatch, prepare=None) -> None:
    """Each command in order; one quoted again as written (a recipe repeating a profile) runs once: its files are
    there."""
    seen: set[str] = set()
    for command, in_block in commands:
        if command in seen:
            continue
        seen.add(command)
        if prepare is not None:
            prepare(command)
        if not command.startswith(("placer ", "OMP_NUM_THREADS")):
            with monkeypatch.context() as scoped:
                _run_other(command, scoped)
        elif runnable(command, in_block):
            rc, out, err = _run_placer(command, monkeypatch)
            assert rc == 0, (command, out[-2000:], err[-2000:])
            assert "Traceback" not in err, (command, err)


@pytest.mark.slow
def test_every_command_the_readme_quotes_runs(session, monkeypatch):
    def prepare(command):
        if "p.json" in command.split() and not Path("p.json").exists():  # export-map's placement of mymodels
            assert main(["place", "mymodels:build", "--cluster", "k80x4", "--method", "m_etf", "-o", "p.json"]) == 0

    _run_all(readme_commands(), monkeypatch, prepare)
    assert Path("runs/mine/best_placement.json").exists() and Path("trace.json").exists() and Path("mine.json").exists()
    assert Path("device_map.json").exists()


@pytest.mark.slow
def test_every_command_placer_help_quotes_runs(session, monkeypatch):
    _run_all(help_commands(), monkeypatch)
    assert Path("runs/nmt2/best_placement.json").exists()
