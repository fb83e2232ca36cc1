"""The README's "Use it from your own agent" snippet runs as written, and says what it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def _section() -> str:
    text = README.read_text()
    return text.split("## Use it from your own agent", 1)[1].split("\n## ", 1)[0]


def test_the_gymnasium_snippet_runs():
    (snippet,) = re.findall(r"```python\n(.*?)```", _section(), re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert re.match(r"reward -\d\.\d{3}; best of 20 random placements \d+\.\d ms", lines[0]), lines
    keys = "['failed', 'item_devices', 'message', 'op_devices', 'peak_bytes', 'status', 'step_time_s', 't_ref_s']"
    assert lines[1] == keys


def test_the_section_publishes_the_split_importable_from_the_product():
    from placer.gym import datasets

    section = _section()
    for dataset, families in datasets.HELD_OUT_FAMILIES.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| {dataset} |"))
        assert all(f"`{family}`" in row.split("|")[2] for family in families), row
