"""Capture (``torch.export``, the checks of the model's own autograd.Functions included) of every model the probes
build: the conformance corpus, docs/conformance/others.py's 27 Hugging Face architectures, docs/ranks/zb/others.py's
22 newer ones, and those of the probes in docs/ranks/zb (``PROBES``: diffusion.py, lucid.py, ... metric.py) and
docs/lora/lora.py whose libraries are installed. One line per model: ``ok`` or the capture's one-line error. From
the repository root:

    PYTHONPATH=. python docs/conformance/capture_scan.py > docs/conformance/capture_scan.log
"""

import os
import sys
import time

sys.path.insert(0, "docs/ranks/zb")
sys.path.insert(0, "docs/lora")
import others as zb  # noqa: E402  (docs/ranks/zb/others.py)

from graphs.export import export_program  # noqa: E402
from graphs.models.corpus import FAMILIES, build  # noqa: E402

conformance_others = {"__file__": os.path.abspath("docs/conformance/others.py"), "__name__": "capture_scan"}
exec(open("docs/conformance/others.py").read().split("\nargs = sys.argv[1:]")[0], conformance_others)  # its MODELS
sources = {
    "corpus": {n: (lambda n=n: build(n)) for n in FAMILIES},
    "others": conformance_others["MODELS"],
    "newer": zb.NEWER,
}
PROBES = (
    "diffusion", "lucid", "pyg", "tune", "med", "equi", "vq", "ode", "rev", "modal", "param", "state", "sci",
    "metric", "lora",
)  # fmt: skip
for probe in PROBES:
    try:
        module = __import__(probe)
    except ImportError as e:
        print(f"{probe}: not importable ({e})")
        continue
    sources[probe] = {k: getattr(module, k) for k in module.MODELS} if probe == "lora" else module.MODELS
for source, models in sources.items():
    for name, make in models.items():
        t = time.time()
        try:
            model, inputs = make()
        except Exception as e:  # a library of the probe that is not installed
            print(f"{source}:{name}: build failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        try:
            export_program(model, inputs, stack_traces=False)
            print(f"{source}:{name}: ok ({time.time() - t:.0f} s)", flush=True)
        except Exception as e:
            print(f"{source}:{name}: {str(e).splitlines()[0][:300]}", flush=True)
