import time

import numpy as np

a = np.ones(64 << 20 // 8 * 8 // 8)
b = np.empty_like(a)
t = time.time()
while time.time() - t < 120:
    np.copyto(b, a)
    np.copyto(a, b)
