"""``placer train``: learn a placement, by default with the move search whose moves a learned critic ranks.

``--algo reinforce|ppo`` trains the paper's policy network instead. The run
itself is :func:`placer.learn.runners.train`; this module builds its config from
the command line and prints its summary.

Example:
    placer train nmt-2 --cluster k80x4 --time-budget 300
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Any, Callable

import envs
from envs.cluster import CLUSTER_ARG_HELP
from graphs import PlacerError
from placer.cli.args import captured, note_stand_in_loss, profiled, roofline_ranks_note
from placer.cli.output import counted, print_json
from placer.compare.table import SMALL_GAIN
from placer.learn.config import (
    PRESETS,
    RESUME_KEEPS,
    AlgoOptions,
    PolicyOptions,
    RunOptions,
    TrainConfig,
    base_type,
    field_docs,
    literal_choices,
    option_name,
)
from placer.learn.progress import Progress
from placer.option_checks import check_output_dir

# Kept for callers and tests: TrainConfig's defaults of the most used options (no longer a copy).
HELP_DEFAULTS = {
    k: getattr(TrainConfig(), k) for k in ("lr", "entropy_coef", "hidden", "samples", "seed", "policy", "algo", "env")
}

_SECTIONS = (
    ("run options", RunOptions),
    ("algorithm options", AlgoOptions),
    ("policy options", PolicyOptions),
    ("preset", TrainConfig),
)
# Help that says more than the field's docstring, or in the command line's terms.
_HELP = {
    "source": "graph file (.json/.pt2), zoo name or module:callable",
    "progress": "print no progress on stderr (a line per phase, then a bar on a terminal or a line every few "
    "seconds in a file or a pipe)",
}
_METAVARS = {
    "profile": "PROFILE.json",
    "device_map": "MAP",
    "measure_timeout_s": "SECONDS",
    "time_budget_s": "SECONDS",
    "heuristics": "NAMES",
    "logdir": "DIR",
    "ray_address": "HOST:PORT",
    "measure_heuristics": "N",
    "rematch": "N",
}


def _names(value: str) -> tuple[str, ...]:
    """``--heuristics a,b``: a comma list of heuristic names ('' : none)."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


def _add_field(group: Any, f: dataclasses.Field, help_text: str) -> None:
    """Add TrainConfig field ``f`` as an option (or SOURCE) whose default is the dataclass's (not set: absent)."""
    name, tp, choices = f.name, base_type(f), literal_choices(f)
    help_text = help_text.replace("%", "%%")  # argparse formats help with %
    if name == "source":
        group.add_argument("source", metavar="SOURCE", help=help_text)
        return
    kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
    default = PRESETS["tuned"].get(name, f.default)  # what placer train uses (--algo: the tuned preset's "moves")
    if tp is bool:
        if name == "progress":  # --no-progress
            kw.update(action="store_false")
        elif default is False:
            kw.update(action="store_true")
        else:
            kw.update(action=argparse.BooleanOptionalAction, help=f"{help_text} (default: {default})")
        group.add_argument(option_name(name), **kw)
        return
    # choices are checked by TrainConfig.validate, so a bad one gets the same one-line message as from Python
    kw["metavar"] = "{" + ",".join(choices) + "}" if choices else _METAVARS.get(name, name.upper().removesuffix("_S"))
    kw["type"] = {int: int, float: float}.get(tp, _names if name == "heuristics" else str)
    if name == "cluster":
        kw.update(required=True)
        kw.pop("default")
    elif default is not None:
        kw["help"] = f"{help_text} (default: {default})"
    group.add_argument(option_name(name), **kw)


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="learn a placement: a move search ranked by a learned critic, or a policy network (--algo)",
        description="Learn a placement of SOURCE's graph. The default learner (--algo moves) is a move search "
        "whose moves a learned critic ranks before they are simulated: it trains no policy network. --algo "
        "reinforce|ppo trains the paper's policy network instead (--policy seq2seq, hierarchical or gnn). "
        "Writes TensorBoard logs, a resumable checkpoint and best_placement.json under --logdir. Every option is a "
        "field of placer.learn.config.TrainConfig (same name, with - for _).",
    )
    docs = {**field_docs(), **_HELP, "cluster": CLUSTER_ARG_HELP}
    seen: set[str] = set()
    for title, cls in _SECTIONS:
        group = p.add_argument_group(title)
        stop = None
        for f in dataclasses.fields(cls):
            if f.name in seen:
                continue
            seen.add(f.name)
            if f.name in ("iterations", "time_budget_s"):  # the two stopping rules exclude each other
                stop = stop or group.add_mutually_exclusive_group()
                _add_field(stop, f, docs[f.name])
            else:
                _add_field(group, f, docs[f.name])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from placer.learn import runners  # torch and TensorBoard: loaded only to train
    from placer.learn.rundir import check_free

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields}  # what the command line set
    options = dict(given)
    if "iterations" not in options and "time_budget_s" not in options:
        options["time_budget_s"] = 300.0
    config = TrainConfig.from_preset(options.pop("preset", "tuned"), **options)
    config.validate()  # before the (possibly slow) capture of SOURCE; checks --logdir too
    if config.logdir is None:
        check_output_dir("runs", "--logdir (default runs/...)")
    else:  # before the (possibly slow) capture: a --logdir in use, or used without --resume
        check_free(config.logdir, resume=config.resume)
    if config.resume:
        config = _resumed_config(config, given)
    cluster = envs.resolve_cluster(config.cluster)
    progress = Progress(enabled=config.progress)  # phase lines on stderr: a terminal, a file or a pipe alike
    graph = captured(config.source, progress, config.microbatches)
    if config.env == "sim":  # real steps refuse such a model instead (placer.learn.run_scorers.measured_env)
        note_stand_in_loss(graph, config.source)
    graph, cluster = profiled(graph, cluster, config.profile, device_map=config.device_map, ranks=config.ranks)
    if config.ranks and config.profile is None and not config.one_stage_per_rank:
        print(f"placer: {roofline_ranks_note('plans of more stages than ranks are')}", file=sys.stderr)
    try:
        result = runners.train(config, graph=graph, cluster=cluster, progress=progress)
    except KeyboardInterrupt:  # before the run had anything to keep (setting up, scoring the heuristics)
        print("placer: train interrupted while setting up; nothing to resume yet", file=sys.stderr)
        return 130
    doc = result.to_dict()
    doc["executor"] = config.executor
    if config.ranks:
        doc["ranks"] = ranks_doc(config, result.best_placement, doc["best_placement"], graph, cluster)
    doc["homes"] = homes_doc(result, graph)
    doc["checkpointing"] = checkpointing_doc(result)
    if result.interrupted:
        doc["resume_command"] = resume_command(config, result.logdir)
        if args.json:  # else the summary's first line says it
            print(
                f"placer: train interrupted after {result.iterations} iterations; the checkpoint is saved, continue "
                f"with: {doc['resume_command']}",
                file=sys.stderr,
            )
    if args.json:
        print_json(doc)
    else:
        print(summary(doc))
    return 130 if result.interrupted else 0


def resume_command(config: TrainConfig, logdir: str) -> str:
    """The command line that continues an interrupted run: its SOURCE, cluster, stopping rule and logdir."""
    stop = (
        ["--iterations", str(config.iterations)]
        if config.iterations is not None
        else ["--time-budget", f"{config.time_budget_s:g}"]
    )
    return shlex.join(
        ["placer", "train", config.source, "--cluster", config.cluster, *stop, "--logdir", logdir, "--resume"]
    )


def _resumed_config(config: TrainConfig, given: dict | None = None) -> TrainConfig:
    """On --resume, the stopping rule, SOURCE, cluster and run-time options given now win (``RESUME_KEEPS``);
    the model and training settings come from the checkpoint's config. Each option in ``given`` (what the
    command line set) that the checkpoint overrides is reported in one line on stderr."""
    from placer.learn import checkpoint  # torch: loaded only to resume

    _, saved = checkpoint.load(config.logdir)
    if not isinstance(saved.get("config"), dict):
        raise PlacerError(f"--resume: {config.logdir}/{checkpoint.CHECKPOINT_PT} is not a placer training checkpoint")
    fields = {f.name for f in dataclasses.fields(config)}
    old = {k: v for k, v in saved["config"].items() if k in fields}
    if isinstance(old.get("heuristics"), list):
        old["heuristics"] = tuple(old["heuristics"])
    ignored = [
        f"{option_name(k)} {v} (checkpoint: {old[k]})"
        for k, v in (given or {}).items()
        if k not in RESUME_KEEPS and k in old and old[k] != v
    ]
    if ignored:
        print(f"placer: note: --resume uses the checkpoint's settings; ignored: {', '.join(ignored)}", file=sys.stderr)
    resumed = dataclasses.replace(config, **{k: v for k, v in old.items() if k not in RESUME_KEEPS})
    resumed.validate()
    return resumed


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f} ms"


def _tag(doc: dict, kind: str) -> str:
    """In a measured run each time says whether it was measured or simulated."""
    return f"  {kind}" if doc.get("env") == "measured" else ""


def _best_line(doc: dict) -> str:
    where = f"{doc['iterations']} iterations, {doc['elapsed_s']:.0f} s"
    by, best = doc.get("found_by") or "", f"{_ms(doc['best_step_time_s'])}{_tag(doc, 'measured')}"
    if by.startswith("heuristic:"):  # the incumbent: no placement the policy found was faster
        best_s, learner_s = doc["best_step_time_s"], doc.get("policy_step_time_s")
        r = doc.get("rematch") or {}
        if r.get("chosen") == "heuristic":  # a side-by-side chose it: medians, not the learner's lucky read
            theirs = f"side by side its median beat the learner's best's, {_ms(r.get('learned_s'))}"
        elif learner_s is None:
            theirs = "the learner found no placement that runs"
        elif learner_s <= best_s:
            theirs = "the learner's best equals it"
        else:
            theirs = f"the learner's best, {_ms(learner_s)}, is {(learner_s / best_s - 1) * 100:.1f}% slower"
        return f"best step time   {best}  ({by.removeprefix('heuristic:')}'s placement, kept: {theirs}; {where})"
    found = f"found at {doc['time_to_best_s']:.0f} s" if doc["time_to_best_s"] is not None else "no placement ran"
    return f"best step time   {best}  (after {where}; {found})"


def versus(learned: float, other: float, name: str) -> str:
    """How the learner's step time compares with ``other``'s, in words: "learned 3.6% faster than it", "learned 1.6%
    slower than module_search", or "learned as fast as it" (within 0.05%).

    >>> versus(0.2, 0.21, "it"), versus(0.2032, 0.2, "module_search"), versus(0.2, 0.20001, "it")
    ('learned 4.8% faster than it', 'learned 1.6% slower than module_search', 'learned as fast as it')
    """
    gain = (1 - learned / other) * 100
    if abs(gain) < 0.05:
        return f"learned as fast as {name}"
    return f"learned {abs(gain):.1f}% {'faster' if gain > 0 else 'slower'} than {name}"


def _heuristic_line(doc: dict) -> str | None:
    measured = doc.get("env") == "measured"
    if not doc["best_heuristic"]:
        if measured and doc.get("measured_heuristics"):
            return f"best heuristic   n/a  measured  (all failed: {', '.join(doc['measured_heuristics'])})"
        return None
    bh, learned, source = doc["best_heuristic_step_time_s"], doc["best_step_time_s"], doc.get("best_heuristic_source")
    comparable = not measured or source == "measured"
    notes = [versus(learned, bh, "it")] if bh and learned and comparable else []
    if not comparable:
        notes = ["no heuristic was measured: not compared"]
    elif (doc.get("rematch") or {}).get("chosen") == "heuristic" and doc.get(
        "found_by"
    ) == f"heuristic:{doc['best_heuristic']}":
        notes.append("its one measurement: the best step time above is its median side by side")
    gain = f"  ({'; '.join(notes)})" if notes else ""
    return f"best heuristic   {_ms(bh)}{_tag(doc, source)}  ({doc['best_heuristic']}){gain}"


def equal_budget_line(doc: dict) -> str | None:
    """The learner against search at equal budget: module_search given as many simulated placements, or the best
    heuristic where that is faster (the gain is against the better of the two, named)."""
    eq = doc.get("equal_budget_search")
    if not eq or eq.get("step_time_s") is None:
        return None
    by_h = f" ({eq['heuristics_simulated']:,} of them by the heuristics)" if eq.get("heuristics_simulated") else ""
    given = f"the {eq['simulated']:,} placements this run simulated{by_h}"
    if eq.get("stopped"):  # it ran out of the run's own time first
        given = (
            f"{eq['simulated']:,} of the {eq['evals']:,} placements this run simulated{by_h}, stopped at the "
            "run's own time"
        )
    search = f"{eq['method']} given {given}"
    if (doc.get("homes") or {}).get("searched"):  # not the rival a run with home moves is judged against
        search += ", op placements only: it has no home moves (the uniform ablation searches them)"
    best, name, heuristic = eq["step_time_s"], eq["method"], doc.get("best_heuristic_step_time_s")
    if heuristic is not None and heuristic < best:  # a poor search at equal budget must not flatter the learner
        best, name = heuristic, doc["best_heuristic"]
        search = f"{name}, the best heuristic, faster than {search}: {_ms(eq['step_time_s'])}"
    learned = doc["best_step_time_s"]
    gain = f"; {versus(learned, best, name)}" if learned else ""
    return (
        f"equal budget     {_ms(best)}{_tag(doc, 'simulated')}  ({search}{gain}; {eq['wall_s']:.0f} s, after the "
        "budget)"
    )


def ablation_line(doc: dict) -> str | None:
    """What the learning added: the same move search with its moves drawn uniformly and the levels in turn (nothing
    learned), given as many placements as the learner's search, from the same start."""
    ab = doc.get("ablation")
    if not ab or ab.get("step_time_s") is None:
        return None
    given = f"the {ab['evals']:,} placements the learner's search simulated"
    if ab.get("stopped"):
        given = (
            f"{ab['simulated']:,} of the {ab['evals']:,} placements the learner's search simulated, stopped at its time"
        )
    learned = doc["best_step_time_s"]
    gain = f"; {versus(learned, ab['step_time_s'], 'its ablation')}" if learned else ""
    return (
        f"uniform ablation {_ms(ab['step_time_s'])}{_tag(doc, 'simulated')}  (the same search, its moves drawn "
        f"uniformly and the levels in turn, given {given}{gain}; {ab['wall_s']:.0f} s, after the budget)"
    )


def _faster_placement_line(doc: dict) -> str | None:
    """Where the equal-budget search beat the learner: the file its placement was kept in."""
    eq = doc.get("equal_budget_search") or {}
    if not eq.get("placement"):
        return None
    return (
        f"faster placement {eq['placement']}  (the equal-budget search's placement, {_ms(eq['step_time_s'])}; "
        "best_placement.json stays the learner's)"
    )


def _rematch_line(doc: dict) -> str | None:
    """--env measured: the best placement and the best heuristic's, re-measured side by side (medians)."""
    r = doc.get("rematch")
    if not r:
        return None
    learned, heuristic = r["learned_s"], r["heuristic_s"]
    gain = f"; {versus(learned, heuristic, 'it')}" if learned and heuristic else ""
    chosen = f"; {r['heuristic']}'s placement is best_placement.json" if r.get("chosen") == "heuristic" else ""
    return (
        f"side by side     {_ms(learned)} learned, {_ms(heuristic)} {r['heuristic']}  measured  "
        f"(medians of {r['rounds']} re-measurements each, alternating{gain}{chosen})"
    )


def _expert_line(doc: dict) -> str | None:
    expert = (doc.get("measured_heuristics") or {}).get("expert")
    if expert is not None:
        return f"expert           {_ms(expert)}{_tag(doc, 'measured')}"
    if doc["expert_step_time_s"] is not None:
        return f"expert           {_ms(doc['expert_step_time_s'])}{_tag(doc, 'simulated')}"
    return None


def _warm_start_line(doc: dict) -> str | None:
    if not doc.get("warm_start_cut_short"):
        return None
    return (
        f"warm start       cut short by the time budget: {doc['warm_start']}, its greedy placement "
        f"{_ms(doc['warm_start_step_time_s'])}; a longer --time-budget lets RL start from the heuristic"
    )


def _interrupted_line(doc: dict) -> str | None:
    return f"interrupted      continue with: {doc['resume_command']}" if doc.get("resume_command") else None


def _issue_order_line(doc: dict) -> str | None:
    if doc.get("issue_order_step_time_s") is not None and doc["issue_order"] != "node":
        return (
            f"issue order      {_ms(doc['issue_order_step_time_s'])}{_tag(doc, 'simulated')}  "
            f"({doc['issue_order']} order, in the placement file)"
        )
    return None


def ranks_doc(config: TrainConfig, best: Any, path: str, graph: Any, cluster: Any) -> dict[str, Any]:
    """``--ranks``: how the best plan (``best``, kept at ``path``) runs across processes (its ranks, microbatches and
    schedule, as the simulator of ranks cuts it) and the ``placer run`` command that runs it so."""
    from envs.sim.ranks import RankSim
    from placer.learn.shapes import SHAPES_JSON

    if best is None:
        return {}
    extra = RankSim(graph, cluster).simulate(best).extra
    doc = {k: extra.get(k) for k in ("ranks", "stages", "schedule", "microbatches", "inflight")}
    shapes = os.path.join(os.path.dirname(path), SHAPES_JSON)
    if config.choose_shape and os.path.exists(shapes):  # --choose-shape: every shape's fastest split
        with open(shapes) as f:
            doc["shape_choice"] = json.load(f)
    command = ["placer", "run", config.source, "--placement", path, "--cluster", config.cluster]
    doc["run_command"] = shlex.join([*command, "--nproc-per-node", str(doc["ranks"])])
    return doc


def homes_doc(result: Any, graph: Any) -> dict[str, Any]:
    """``homes`` of the summary: whether the run searched home moves (``--homes``), how many parameters (and
    bytes) its best placement homes apart from their ops, and when it steps them (``host_step``; ``host_step_s``:
    its eager time stepping them each way, where ``--host-step auto`` chose)."""
    best = result.best_placement
    return {
        "searched": result.homes_searched,
        "params": len(best.param_homes) if best is not None else 0,
        "param_bytes": best.homed_bytes(graph) if best is not None else 0.0,
        "host_step": best.host_step if best is not None else "after",
        "host_step_s": best.meta.get("host_step_s") if best is not None else None,
    }


def checkpointing_doc(result: Any) -> dict[str, Any]:
    """``checkpointing`` of the summary: whether the run's placements checkpointed layers (``--checkpointing``), and
    the layers its best placement checkpoints."""
    best = result.best_placement
    return {"searched": result.checkpointing_searched, "blocks": list(best.checkpoint) if best is not None else []}


def _checkpointing_line(doc: dict) -> str | None:
    ck = doc.get("checkpointing") or {}
    if not ck.get("searched"):
        return None
    blocks = ck["blocks"]
    if not blocks:
        return "checkpointing    none: the best placement keeps every activation (checkpointed layers searched)"
    from placer.cli.output import first_few

    return (
        f"checkpointing    {len(blocks)} layer{'s' if len(blocks) != 1 else ''} ({first_few(blocks)}) run "
        f"{'its' if len(blocks) == 1 else 'their'} forward again in the backward (placer.apply runs them)"
    )


def _homes_line(doc: dict) -> str | None:
    from placer.cli.output import nbytes

    homes = doc.get("homes") or {}
    if not homes.get("searched"):
        return None
    if not homes["params"]:
        return "homes            none: the best placement keeps every parameter with its ops (home moves searched)"
    n = homes["params"]
    during = homes.get("host_step") == "backward"
    compared = homes.get("host_step_s")
    versus = f" (simulated {_ms(compared['backward'])} during, {_ms(compared['after'])} after)" if compared else ""
    when = (
        f"stepped during the backward{versus}: call placer.apply.step_in_backward(placed, optimizer)"
        if during
        else f"stepped after the backward{versus}"
    )
    return (
        f"homes            {n} parameter{'s' if n != 1 else ''} ({nbytes(homes['param_bytes'])}) "
        f"live{'s' if n == 1 else ''} on the host, copied to {'its' if n == 1 else 'their'} ops' GPU ahead of use "
        f"(placer.apply runs them), {when}"
    )


def ranks_line(doc: dict) -> str | None:
    """--ranks: the best plan's ranks, and the command that runs it across processes."""
    r = doc.get("ranks")
    if not r or not r.get("ranks"):
        return None
    chosen = f" (chosen of {len(r['shape_choice']['rows'])} shapes)" if r.get("shape_choice") else ""
    return (
        f"across processes {counted(r['ranks'], 'rank')}, {counted(r['stages'], 'stage')}, {r['schedule']} over "
        f"{counted(r['microbatches'], 'microbatch', 'microbatches')}{chosen}; run it: {r['run_command']}"
    )


def small_model_line(doc: dict) -> str | None:
    best, single = doc["best_step_time_s"], doc.get("reference_step_time_s")
    if best is None or not single or best * SMALL_GAIN < single or doc.get("env") == "measured":
        return None
    if "single" in (doc.get("heuristics") or {}) and doc["heuristics"]["single"] is None:
        return None  # no single device holds the model: its time (memory ignored) is no plan to fall back on
    return (
        f"note             not {(SMALL_GAIN - 1) * 100:.0f}% faster than the best single device ({_ms(single)}): "
        "this model is "
        "too small to gain from splitting it over devices"
    )


#: The summary ``placer train`` prints, a line each (None: no line): add a line here.
SUMMARY_LINES: tuple[Callable[[dict], str | None], ...] = (
    _interrupted_line,
    _best_line,
    _heuristic_line,
    _rematch_line,
    equal_budget_line,
    ablation_line,
    _faster_placement_line,
    _warm_start_line,
    small_model_line,
    _expert_line,
    lambda doc: (
        f"lower bound      {_ms(doc['lower_bound_s'])}{_tag(doc, 'simulated')}"
        if doc["lower_bound_s"] is not None
        else None
    ),
    _issue_order_line,
    _homes_line,
    _checkpointing_line,
    ranks_line,
    lambda doc: f"placement        {doc['best_placement']}" if doc["best_placement"] else None,
    lambda doc: (
        f"logs             {doc['logdir']}  (tensorboard --logdir {doc['logdir']}; summary.json, checkpoint.pt)"
    ),
)


def summary(doc: dict) -> str:
    """The lines of :data:`SUMMARY_LINES` for a run's ``summary.json`` document."""
    return "\n".join(line for make in SUMMARY_LINES if (line := make(doc)) is not None)
