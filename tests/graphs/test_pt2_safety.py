"""A ``.pt2`` SOURCE is data: placer refuses pickled payloads instead of running them.

Each malicious archive is a real ``torch.export.save`` output, re-zipped with one
entry changed so that torch's own loader would run code (here: create a marker
file). Every test checks that placer refuses it with one line naming the entry,
that the marker does not exist, and then that ``torch.export.load`` itself does
create it, so the test would fail on a loader that trusts the archive.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

import graphs
from graphs import GraphFormatError


class _Payload:
    """Unpickling this calls ``open(path, "w")``: creates ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.ones(3))
        self.const = torch.full((3,), 2.0)  # a lifted tensor constant

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale + self.const


@pytest.fixture(scope="module")
def clean_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2") / "clean.pt2"
    torch.export.save(torch.export.export(_Small(), (torch.randn(2, 4),)), str(path))
    return path


def _pickled(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _rezip(src, dst, edit) -> None:
    """Copy the archive ``src`` to ``dst``, passing ``{name: bytes}`` (names without the top folder) through
    ``edit``."""
    with zipfile.ZipFile(src) as zin:
        prefix = zin.namelist()[0].split("/", 1)[0] + "/"
        entries = {n[len(prefix) :]: zin.read(n) for n in zin.namelist()}
    edit(entries)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for name, data in entries.items():
            zout.writestr(prefix + name, data)


def _pickled_tensor(marker, folder: str, key: str | None):
    """An edit that stores tensor ``key`` of the archive's ``data/<folder>/`` (None: its only one) as a pickle of a
    payload."""
    config = f"data/{folder}/model_{folder}_config.json"

    def edit(entries):
        cfg = json.loads(entries[config])
        (meta,) = cfg["config"].values() if key is None else (cfg["config"][key],)
        meta["use_pickle"] = True
        entries[f"data/{folder}/" + meta["path_name"]] = _pickled(_Payload(marker))
        entries[config] = json.dumps(cfg).encode()

    return edit


def _pickled_weight(marker):
    return _pickled_tensor(marker, "weights", "lin.weight"), "data/weights/weight_0"


def _pickled_constant(marker):
    return _pickled_tensor(marker, "constants", None), "data/constants/tensor_0"


def _opaque_constant(marker):
    def edit(entries):
        import pickle

        cfg = json.loads(entries["data/constants/model_constants_config.json"])
        (meta,) = cfg["config"].values()
        meta.update(path_name="opaque_obj_0", use_pickle=True)
        entries["data/constants/opaque_obj_0"] = pickle.dumps(_Payload(marker))
        entries["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()

    return edit, "data/constants/opaque_obj_0"


def _pickled_inputs(marker):
    def edit(entries):
        entries["data/sample_inputs/model.pt"] = _pickled(((_Payload(marker),), {}))

    return edit, "data/sample_inputs/model.pt"


def _sympy_eval(marker):
    def edit(entries):
        doc = json.loads(entries["models/model.json"])
        # A symbolic size whose expression sympify would eval.
        meta = doc["graph_module"]["graph"]["tensor_values"]
        name, value = next(iter(meta.items()))
        value["sizes"][0] = {
            "as_expr": {"expr_str": f"__import__('builtins').open({str(marker)!r}, 'w') and 2", "hint": {"as_int": 2}}
        }
        entries["models/model.json"] = json.dumps(doc).encode()

    return edit, "models/model.json"


ATTACKS = {
    "pickled weight": _pickled_weight,
    "pickled constant": _pickled_constant,
    "opaque constant": _opaque_constant,
    "pickled example inputs": _pickled_inputs,
    "sympy expression": _sympy_eval,
}


@pytest.fixture(scope="module")
def trusting_loader_runs(tmp_path_factory, clean_pt2) -> dict[str, bool]:
    """Attack -> whether ``torch.export.load`` runs its payload: a copy of every archive loaded in one child
    process (one torch import for all; a payload cannot touch this process)."""
    folder = tmp_path_factory.mktemp("trusting")
    paths = {}
    for attack, make in ATTACKS.items():
        stem = attack.replace(" ", "_")
        edit, _ = make(folder / f"{stem}.PWNED")
        paths[attack] = folder / f"{stem}.pt2"
        _rezip(clean_pt2, paths[attack], edit)
    code = (
        "import sys, torch\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        torch.export.load(path)\n"
        "    except Exception:\n"
        "        pass\n"
    )
    subprocess.run([sys.executable, "-c", code, *map(str, paths.values())], capture_output=True, timeout=300)
    return {attack: path.with_suffix(".PWNED").exists() for attack, path in paths.items()}


@pytest.mark.slow
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_graphs_load_refuses_and_runs_nothing(tmp_path, clean_pt2, attack, trusting_loader_runs):
    marker = tmp_path / "PWNED"
    edit, entry = ATTACKS[attack](marker)
    evil = tmp_path / "evil.pt2"
    _rezip(clean_pt2, evil, edit)
    with pytest.raises(GraphFormatError) as info:
        graphs.load(evil)
    msg = str(info.value)
    assert msg.startswith(f"{evil}: refusing entry {entry!r}") and "\n" not in msg
    assert not marker.exists()
    assert trusting_loader_runs[attack], "the crafted archive should run its payload under torch.export.load"


def test_the_clean_archive_loads_and_matches_capture(clean_pt2, tmp_path):
    g = graphs.load(clean_pt2)
    direct = graphs.capture(_Small(), (torch.randn(2, 4),))
    assert g.op_types == direct.op_types and g.total_param_bytes == direct.total_param_bytes
    # A re-zip that changes nothing still loads: the check is about content, not bytes.
    same = tmp_path / "same.pt2"
    _rezip(clean_pt2, same, lambda entries: None)
    assert graphs.load(same).content_hash == g.content_hash


def test_a_dynamic_shape_program_passes_the_expression_check(tmp_path):
    class Flat(torch.nn.Module):
        def forward(self, x):
            return x.reshape(-1) * 2

    ep = torch.export.export(Flat(), (torch.randn(4, 3),), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=64)},))
    path = tmp_path / "dyn.pt2"
    torch.export.save(ep, str(path))
    from graphs.pt2 import load_program

    assert "expr_str" in zipfile.ZipFile(path).read("dyn/models/model.json").decode()
    load_program(str(path))  # no GraphFormatError


@pytest.mark.parametrize(
    "edit, entry",
    [
        (lambda e: e.__setitem__("data/aotinductor/model/evil.so", b"\x7fELF"), "data/aotinductor/model/evil.so"),
        (lambda e: e.__setitem__("data/weights/model.pt", _pickled({})), "data/weights/model.pt"),
        (lambda e: e.__setitem__("serialized_state_dict.pt", _pickled({})), "serialized_state_dict.pt"),
    ],
)
def test_other_code_carrying_entries_are_refused(tmp_path, clean_pt2, edit, entry):
    evil = tmp_path / "evil.pt2"
    _rezip(clean_pt2, evil, edit)
    with pytest.raises(GraphFormatError, match="refusing entry") as info:
        graphs.load(evil)
    assert entry in str(info.value)


def test_duplicate_and_case_folded_names_are_refused(tmp_path, clean_pt2):
    evil = tmp_path / "dup.pt2"
    _rezip(clean_pt2, evil, lambda e: None)
    with zipfile.ZipFile(evil, "a") as z:
        z.writestr("clean/data/weights/MODEL_weights_config.json", b"{}")
    with pytest.raises(GraphFormatError, match="appears twice"):
        graphs.load(evil)


def test_not_a_zip(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(GraphFormatError, match="not a loadable torch.export program"):
        graphs.load(bad)


# ------------------------------------------------------------------ every SOURCE-taking command
def _commands(evil, tmp):
    return {
        "inspect": ["inspect", evil],
        "export": ["export", evil, "-o", str(tmp / "g.json")],
        "simulate": ["simulate", evil, str(tmp / "p.json"), "--cluster", "k80x2"],
        "compare": ["compare", evil, "--cluster", "k80x2", "--methods", "single"],
        "place": ["place", evil, "--cluster", "k80x2", "--method", "single", "-o", str(tmp / "p2.json")],
        "train": ["train", evil, "--cluster", "k80x2", "--time-budget", "5", "--logdir", str(tmp / "run")],
    }


@pytest.mark.parametrize("command", ["inspect", "export", "simulate", "compare", "place", "train"])
def test_every_source_command_refuses_the_pickled_weight(tmp_path, clean_pt2, capsys, command):
    from graphs.plan import Placement
    from placer.cli import main

    marker = tmp_path / "PWNED"
    edit, entry = _pickled_weight(marker)
    evil = tmp_path / "evil.pt2"
    _rezip(clean_pt2, evil, edit)
    # A placement file for `simulate`, made for the clean program.
    g = graphs.load(clean_pt2)
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1] * g.num_ops).save(tmp_path / "p.json")
    rc = main(_commands(str(evil), tmp_path)[command])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and f"refusing entry {entry!r}" in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.slow
def test_the_real_cli_refuses_in_a_subprocess(tmp_path, clean_pt2):
    marker = tmp_path / "PWNED"
    edit, entry = _pickled_weight(marker)
    evil = tmp_path / "evil.pt2"
    _rezip(clean_pt2, evil, edit)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run(
        [sys.executable, "-m", "placer", "inspect", str(evil)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and entry in out.stderr, out.stderr
    assert not marker.exists()
