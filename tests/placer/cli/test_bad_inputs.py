"""The bad-input catalogue: every command, every kind of bad input, exit 2 and one line.

The cases are generated here from a good graph, cluster, placement and option set,
each broken in one way (a file corrupted, a field of the wrong type, an option out
of range, an output path that cannot be written), and run through the CLI
in-process. Each must end with exit status 2 and exactly one line on stderr that
names the file or the option at fault, and never with a traceback. The messages
themselves are not pinned: only that the culprit is named.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Callable

import pytest

import graphs
from envs.cluster import Cluster
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main

CLUSTER = "k80x2"


@dataclass
class World:
    """A directory with one good graph, cluster and placement to break copies of."""

    tmp: str
    graph: str
    graph_doc: dict
    cluster: str
    cluster_doc: dict
    placement: str
    placement_doc: dict

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def write(self, name: str, text: str | bytes) -> str:
        p = self.path(name)
        with open(p, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        return p

    def write_json(self, name: str, doc) -> str:
        return self.write(name, json.dumps(doc))


@dataclass
class Case:
    id: str
    argv: Callable[[World], list[str]]
    needle: Callable[[World], str] = field(default=lambda w: "")
    """a piece of text the one error line must contain (the file or option at fault)."""


@pytest.fixture
def world(tmp_path) -> World:
    g = random_dag(30, seed=1, name="tiny")
    gpath = str(tmp_path / "g.json")
    graphs.save(g, gpath)
    cluster = Cluster.preset(CLUSTER)
    cpath = str(tmp_path / "c.json")
    with open(cpath, "w") as f:
        json.dump(cluster.to_dict(), f)
    p = Placement.from_indices(g, cluster.device_names, [i % cluster.num_devices for i in range(g.num_ops)])
    ppath = str(tmp_path / "p.json")
    p.save(ppath)
    with open(gpath) as f:
        gdoc = json.load(f)
    with open(cpath) as f:
        cdoc = json.load(f)
    with open(ppath) as f:
        pdoc = json.load(f)
    return World(str(tmp_path), gpath, gdoc, cpath, cdoc, ppath, pdoc)


# --------------------------------------------------------------- corruptions
def _graph_variant(mutate: Callable[[dict], object]) -> Callable[[World], str]:
    def make(w: World) -> str:
        doc = copy.deepcopy(w.graph_doc)
        doc.pop("hash", None)  # so the schema, not the hash, must catch it
        out = mutate(doc)
        return w.write_json("bad_graph.json", doc if out is None else out)

    return make


def _set(path: tuple, value) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        obj = doc
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value

    return mutate


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_GRAPH_FILES: dict[str, Callable[[World], str]] = {
    "missing": lambda w: w.path("nope.json"),
    "empty": lambda w: w.write("empty.json", ""),
    "not-json": lambda w: w.write("bad.json", "this is not json"),
    "truncated": lambda w: w.write("trunc.json", json.dumps(w.graph_doc)[:200]),
    "binary": lambda w: w.write("bin.json", bytes(range(256)) * 4),
    "top-level-list": lambda w: w.write_json("list.json", [1, 2, 3]),
    "deeply-nested": lambda w: w.write("deep.json", _nested(100_000)),
    "wrong-format": _graph_variant(_set(("format",), "placer-graph/999")),
    "ops-missing": _graph_variant(lambda d: d.pop("ops")),
    "column-not-list": _graph_variant(_set(("ops", "flops"), "many")),
    "column-short": _graph_variant(lambda d: d["ops"]["flops"].pop()),
    "bool-as-number": _graph_variant(lambda d: d["ops"]["flops"].__setitem__(0, True)),
    "string-as-number": _graph_variant(lambda d: d["ops"]["param_bytes"].__setitem__(0, "12")),
    "param-bytes-2**63": _graph_variant(lambda d: d["ops"]["param_bytes"].__setitem__(0, 2**63)),
    "int-too-big-for-float": _graph_variant(lambda d: d["ops"]["flops"].__setitem__(0, 10**400)),
    "negative-bytes": _graph_variant(lambda d: d["edges"]["bytes"].__setitem__(0, -5)),
    "edge-out-of-range": _graph_variant(lambda d: d["edges"]["dst"].__setitem__(0, 10_000)),
    "meta-not-dict": _graph_variant(_set(("meta",), [1, 2])),
    "alias-ops-wrong-type": _graph_variant(_set(("meta",), {"alias_ops": 7})),
    "hash-mismatch": lambda w: w.write_json("hash.json", {**w.graph_doc, "hash": "0" * 64}),
    "gz-not-gzip": lambda w: w.write("g.json.gz", "plain text"),
    "directory": lambda w: (os.makedirs(w.path("adir.json"), exist_ok=True), w.path("adir.json"))[1],
    "pt2-garbage": lambda w: w.write("model.pt2", b"PK\x03\x04 not really a zip"),
}


def _cluster_variant(mutate: Callable[[dict], None]) -> Callable[[World], str]:
    def make(w: World) -> str:
        doc = copy.deepcopy(w.cluster_doc)
        mutate(doc)
        return w.write_json("bad_cluster.json", doc)

    return make


BAD_CLUSTERS: dict[str, Callable[[World], str]] = {
    "unknown-preset": lambda w: "no-such-cluster",
    "not-json": lambda w: w.write("c.json", "{"),
    "no-devices": _cluster_variant(_set(("devices",), [])),
    "negative-memory": _cluster_variant(lambda d: d["devices"][1].__setitem__("memory_bytes", -1)),
    "tiny-rate": _cluster_variant(lambda d: d["devices"][1].__setitem__("flops_per_s", 1e-300)),
    "tiny-mem-bw": _cluster_variant(lambda d: d["devices"][1].__setitem__("mem_bw_bytes_per_s", 1e-300)),
    "nan-latency": lambda w: w.write(
        "nan.json", json.dumps(w.cluster_doc).replace('"latency_s": 1e-05', '"latency_s": NaN', 1)
    ),
    "string-rate": _cluster_variant(lambda d: d["devices"][1].__setitem__("flops_per_s", "fast")),
    "bool-rate": _cluster_variant(lambda d: d["devices"][1].__setitem__("flops_per_s", True)),
    "link-src-list": _cluster_variant(lambda d: d["links"][0].__setitem__("src", ["cpu:0"])),
    "link-unknown-device": _cluster_variant(lambda d: d["links"][0].__setitem__("dst", "gpu:9")),
    "bidirectional-string": _cluster_variant(lambda d: d["links"][0].__setitem__("bidirectional", "false")),
    "duplicate-device": _cluster_variant(lambda d: d["devices"].append(dict(d["devices"][1]))),
    "bad-kind": _cluster_variant(lambda d: d["devices"][1].__setitem__("kind", "tpu")),
}


def _placement_variant(mutate: Callable[[dict], None]) -> Callable[[World], str]:
    def make(w: World) -> str:
        doc = copy.deepcopy(w.placement_doc)
        mutate(doc)
        return w.write_json("bad_placement.json", doc)

    return make


def _other_graph_placement(w: World) -> str:
    g2 = random_dag(31, seed=2, name="other")
    p = Placement.from_indices(g2, Cluster.preset(CLUSTER).device_names, [0] * g2.num_ops)
    path = w.path("other_p.json")
    p.save(path)
    return path


def _first_assignment_key(doc: dict) -> str:
    a = doc.get("assignment")
    return next(iter(a)) if isinstance(a, dict) else ""


BAD_PLACEMENTS: dict[str, Callable[[World], str]] = {
    "missing": lambda w: w.path("nope_p.json"),
    "not-json": lambda w: w.write("p.json.bad", "[[["),
    "another-graph": _other_graph_placement,
    "wrong-format": _placement_variant(_set(("format",), "placer-placement/0")),
    "unknown-device": _placement_variant(lambda d: d["assignment"].__setitem__(_first_assignment_key(d), "gpu:7")),
    "device-not-string": _placement_variant(lambda d: d["assignment"].__setitem__(_first_assignment_key(d), 1)),
    "op-missing": _placement_variant(lambda d: d["assignment"].pop(_first_assignment_key(d))),
    "assignment-list": _placement_variant(_set(("assignment",), ["gpu:0"])),
}


# --------------------------------------------------------------------- cases
def _cases() -> list[Case]:
    cases: list[Case] = []
    # A bad graph file given to every command that reads a graph.
    graph_commands: dict[str, Callable[[World, str], list[str]]] = {
        "inspect": lambda w, g: ["inspect", g],
        "place": lambda w, g: ["place", g, "--cluster", CLUSTER, "--method", "single", "-o", w.path("out.json")],
        "simulate": lambda w, g: ["simulate", g, w.placement, "--cluster", CLUSTER],
        "compare": lambda w, g: ["compare", g, "--cluster", CLUSTER, "--methods", "single"],
        "train": lambda w, g: [
            "train",
            g,
            "--cluster",
            CLUSTER,
            "--iterations",
            "1",
            "--no-progress",
            "--logdir",
            w.path("run"),
        ],
    }
    for bad_name, make_bad in BAD_GRAPH_FILES.items():
        for cmd, argv in graph_commands.items():
            # every corruption through inspect and simulate; the others through a sample
            if cmd not in ("inspect", "simulate") and bad_name not in (
                "truncated",
                "deeply-nested",
                "param-bytes-2**63",
                "meta-not-dict",
                "pt2-garbage",
            ):
                continue
            cases.append(
                Case(
                    f"graph-{bad_name}-{cmd}",
                    (lambda mb, av: lambda w: av(w, mb(w)))(make_bad, argv),
                    (lambda mb: lambda w: os.path.basename(mb(w)))(make_bad),
                )
            )
    # A bad cluster given to simulate (and a sample to place/compare/train).
    for bad_name, make_bad in BAD_CLUSTERS.items():
        for cmd in (
            ("simulate", "place", "compare", "train") if bad_name in ("tiny-rate", "link-src-list") else ("simulate",)
        ):

            def argv(w, mb=make_bad, cmd=cmd):
                c = mb(w)
                return {
                    "simulate": ["simulate", w.graph, w.placement, "--cluster", c],
                    "place": ["place", w.graph, "--cluster", c, "-o", w.path("out.json")],
                    "compare": ["compare", w.graph, "--cluster", c, "--methods", "single"],
                    "train": [
                        "train",
                        w.graph,
                        "--cluster",
                        c,
                        "--iterations",
                        "1",
                        "--no-progress",
                        "--logdir",
                        w.path("run"),
                    ],
                }[cmd]

            cases.append(
                Case(f"cluster-{bad_name}-{cmd}", argv, (lambda mb: lambda w: os.path.basename(mb(w)))(make_bad))
            )
    # A bad placement given to simulate and compare --placement.
    for bad_name, make_bad in BAD_PLACEMENTS.items():
        cases.append(
            Case(
                f"placement-{bad_name}-simulate",
                (lambda mb: lambda w: ["simulate", w.graph, mb(w), "--cluster", CLUSTER])(make_bad),
                (lambda mb: lambda w: os.path.basename(mb(w)))(make_bad),
            )
        )
        cases.append(
            Case(
                f"placement-{bad_name}-compare",
                (
                    lambda mb: (
                        lambda w: [
                            "compare",
                            w.graph,
                            "--cluster",
                            CLUSTER,
                            "--methods",
                            "single",
                            "--placement",
                            mb(w),
                        ]
                    )
                )(make_bad),
                (lambda mb: lambda w: os.path.basename(mb(w)))(make_bad),
            )
        )

    # Numeric options out of range or not finite.
    def train(w, *opt):
        budget = [] if "--time-budget" in opt or "--iterations" in opt else ["--iterations", "1"]
        return ["train", w.graph, "--cluster", CLUSTER, *budget, "--no-progress", "--logdir", w.path("run"), *opt]

    bad_train_options = [
        ("--hidden", "0"),
        ("--hidden", "-4"),
        ("--lr", "-1"),
        ("--lr", "nan"),
        ("--lr", "inf"),
        ("--entropy", "nan"),
        ("--entropy", "-1"),
        ("--samples", "0"),
        ("--time-budget", "-5"),
        ("--time-budget", "nan"),
        ("--iterations", "0"),
        ("--max-groups", "-1"),
        ("--policy", "nope"),
        ("--algo", "nope"),
        ("--env", "nope"),
        ("--warm-start", "nope"),
        ("--device", "tpu:0"),
        ("--hidden", "many"),
    ]
    for opt, val in bad_train_options:
        cases.append(
            Case(
                f"train-option{opt}={val}",
                (lambda o, v: lambda w: train(w, o, v))(opt, val),
                (lambda o: lambda w: o)(opt),
            )
        )
    other_options = [
        ("inspect-top", lambda w: ["inspect", w.graph, "--top", "-1"], "--top"),
        (
            "place-method",
            lambda w: ["place", w.graph, "--cluster", CLUSTER, "--method", "nope", "-o", w.path("o.json")],
            "nope",
        ),
        (
            "place-option-syntax",
            lambda w: ["place", w.graph, "--cluster", CLUSTER, "--option", "novalue", "-o", w.path("o.json")],
            "novalue",
        ),
        (
            "place-option-unknown",
            lambda w: [
                "place",
                w.graph,
                "--cluster",
                CLUSTER,
                "--method",
                "single",
                "--option",
                "bogus=1",
                "-o",
                w.path("o.json"),
            ],
            "bogus",
        ),
        ("compare-methods", lambda w: ["compare", w.graph, "--cluster", CLUSTER, "--methods", "single,nope"], "nope"),
        (
            "run-steps",
            lambda w: ["run", "rnnlm", "--placement", w.placement, "--cluster", CLUSTER, "--steps", "0"],
            "--steps",
        ),
        (
            "run-warmup",
            lambda w: ["run", "rnnlm", "--placement", w.placement, "--cluster", CLUSTER, "--warmup", "-1"],
            "--warmup",
        ),
        ("run-lr", lambda w: ["run", "rnnlm", "--placement", w.placement, "--cluster", CLUSTER, "--lr", "nan"], "--lr"),
        ("profile-repeats", lambda w: ["profile", "rnnlm", "-o", w.path("prof.json"), "--repeats", "0"], "--repeats"),
        ("profile-warmup", lambda w: ["profile", "rnnlm", "-o", w.path("prof.json"), "--warmup", "-1"], "--warmup"),
        (
            "profile-microbatches",
            lambda w: ["profile", "rnnlm", "-o", w.path("prof.json"), "--microbatches", "0"],
            "--microbatches",
        ),
        (
            "profile-microbatches-ranks",
            lambda w: ["profile", "rnnlm", "-o", w.path("r.json"), "--ranks", "2", "--microbatches", "4"],
            "--microbatches: a profile of op times only",
        ),
        ("unknown-source", lambda w: ["inspect", "no-such-model"], "no-such-model"),
        ("bad-module", lambda w: ["inspect", "no_such_module_xyz:build"], "no_such_module_xyz"),
    ]
    for name, argv, needle in other_options:
        cases.append(Case(name, argv, (lambda n: lambda w: n)(needle)))
    # Output paths that cannot be written (checked before any work starts).
    outputs = [
        (
            "place-o-missing-dir",
            lambda w: ["place", w.graph, "--cluster", CLUSTER, "--method", "single", "-o", w.path("no/dir/p.json")],
            "p.json",
        ),
        (
            "place-o-directory",
            lambda w: ["place", w.graph, "--cluster", CLUSTER, "--method", "single", "-o", w.tmp],
            os.sep,
        ),
        (
            "simulate-trace-missing-dir",
            lambda w: ["simulate", w.graph, w.placement, "--cluster", CLUSTER, "--trace", w.path("no/t.json")],
            "t.json",
        ),
        (
            "simulate-trace-directory",
            lambda w: ["simulate", w.graph, w.placement, "--cluster", CLUSTER, "--trace", w.tmp],
            os.sep,
        ),
        ("train-logdir-is-file", lambda w: [*train(w)[:-1], w.graph], "g.json"),
        ("export-o-missing-dir", lambda w: ["export", "rnnlm", "-o", w.path("no/g.json")], "g.json"),
        ("profile-o-missing-dir", lambda w: ["profile", "rnnlm", "-o", w.path("no/prof.json")], "prof.json"),
        (
            "compare-plot-missing-dir",
            lambda w: ["compare", w.graph, "--cluster", CLUSTER, "--methods", "single", "--plot", w.path("no/x.png")],
            "x.png",
        ),
    ]
    for name, argv, needle in outputs:
        cases.append(Case(name, argv, (lambda n: lambda w: n)(needle)))
    return cases


CASES = _cases()


def test_the_catalogue_is_large_and_covers_every_command():
    assert len(CASES) >= 40
    commands = {c.argv.__name__ for c in CASES}  # noqa: F841 - names only; the set below is what counts
    seen = set()
    w = World("/x", "/x/g.json", {}, "/x/c.json", {}, "/x/p.json", {})
    for c in CASES:
        try:
            seen.add(c.argv(w)[0])
        except Exception:  # a corruption needs real files; the command is still one of the known ones
            pass
    assert {"inspect", "place", "simulate", "compare", "train", "run", "profile", "export"} <= seen


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_line(case: Case, world: World, capsys, monkeypatch):
    monkeypatch.chdir(world.tmp)
    argv = case.argv(world)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, f"{argv}: exit {rc}\nstdout: {out[-500:]}\nstderr: {err[-2000:]}"
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"{argv}: expected one stderr line, got {len(lines)}:\n{err[-2000:]}"
    needle = case.needle(world)
    assert needle in lines[0], f"{argv}: the message does not name {needle!r}: {lines[0]}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only locations")
def test_read_only_output_location(world: World, capsys):
    ro = world.path("ro")
    os.makedirs(ro)
    os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
    try:
        rc = main(["place", world.graph, "--cluster", CLUSTER, "--method", "single", "-o", os.path.join(ro, "p.json")])
    finally:
        os.chmod(ro, stat.S_IRWXU)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "p.json" in err


def test_gzip_graph_is_read(world: World, capsys):
    """Control: the .gz reader works on a real gzip file, so its failure case above is the corruption."""
    gz = world.path("g.json.gz")
    with gzip.open(gz, "wt") as f:
        json.dump(world.graph_doc, f)
    assert main(["inspect", gz]) == 0
