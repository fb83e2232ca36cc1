"""A memory-bound loop for the other core: copies between two 64 MiB arrays for SECONDS (default 120)."""

import sys
import time

import numpy as np

a = np.ones((64 << 20) // 8)
b = np.empty_like(a)
end = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 120)
while time.time() < end:
    np.copyto(b, a)
    np.copyto(a, b)
