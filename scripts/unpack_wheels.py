"""Unpack wheels into a folder that goes on ``PYTHONPATH``, where no pip is at hand (a lent GPU machine's Python may
have none): a wheel is a zip of what goes into site-packages, its ``*.data/scripts`` into ``bin`` (made executable:
torch's extension builder runs the ``ninja`` found there on ``PATH``). No entry points are written, no dependencies
resolved: the folder holds every wheel needed (``scripts/gpu_wheels.sh``).

    python3 scripts/unpack_wheels.py .gpu_wheels .gpu_site
"""

from __future__ import annotations

import glob
import os
import sys
import zipfile


def unpack(wheels: str, site: str) -> list[str]:
    """Every ``*.whl`` under ``wheels`` unpacked into ``site``; returns the wheels' names."""
    done = []
    os.makedirs(os.path.join(site, "bin"), exist_ok=True)
    for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                parts = name.split("/")
                if name.endswith("/"):
                    continue
                if len(parts) > 2 and parts[0].endswith(".data"):
                    if parts[1] == "scripts":
                        target = os.path.join(site, "bin", parts[-1])
                    elif parts[1] in ("purelib", "platlib"):
                        target = os.path.join(site, *parts[2:])
                    else:  # headers, data: not needed to import or build
                        continue
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with open(target, "wb") as f:
                        f.write(z.read(name))
                    if parts[1] == "scripts":
                        os.chmod(target, 0o755)
                else:
                    z.extract(name, site)
        done.append(os.path.basename(wheel))
    return done


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 scripts/unpack_wheels.py WHEELS_DIR SITE_DIR")
    print("unpacked:", ", ".join(unpack(sys.argv[1], sys.argv[2])) or "nothing")
