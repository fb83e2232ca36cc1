"""scripts/unpack_wheels.py: wheels unpacked for import where no pip is at hand (a lent GPU machine's Python)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_wheel_s_modules_and_scripts_land_where_python_and_path_find_them(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "tool-1.0-py3-none-any.whl", "w") as z:
        z.writestr("tool/__init__.py", "VALUE = 7\n")
        z.writestr("tool-1.0.data/scripts/tool", "#!/bin/sh\necho ran\n")
        z.writestr("tool-1.0.data/purelib/tool_extra.py", "EXTRA = 8\n")
        z.writestr("tool-1.0.data/headers/tool.h", "int x;\n")
        z.writestr("tool-1.0.dist-info/METADATA", "Name: tool\n")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "unpack_wheels.py"), str(wheels), str(site)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tool-1.0-py3-none-any.whl" in done.stdout
    imported = subprocess.run(
        [sys.executable, "-c", "import tool, tool_extra; print(tool.VALUE + tool_extra.EXTRA)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        check=True,
    )
    assert imported.stdout.strip() == "15"
    script = site / "bin" / "tool"
    assert os.access(script, os.X_OK)  # torch's extension builder runs the ninja it finds on PATH
    assert subprocess.run([str(script)], capture_output=True, text=True).stdout == "ran\n"
    assert not (site / "tool.h").exists() and not (site / "tool-1.0.data").exists()  # headers are not needed here
