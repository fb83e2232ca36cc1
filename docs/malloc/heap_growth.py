"""The heap under placer's steady malloc, with glibc's thread cache on and off: a 1.25 GiB tensor made and freed at
every step, 9 steps, in fresh processes (one thread), the two settings interleaved; then one-thread training steps of
three of bench.rank_models' models, ABAB.

    PYTHONPATH=. python docs/malloc/heap_growth.py [RUNS] [MODEL_ROUNDS]   # 12 and 3 by default
"""

import os
import resource
import statistics
import subprocess
import sys
import time

SETTINGS = {"cache on": "", "cache off": "glibc.malloc.tcache_count=0"}
BLOCK = 5 << 28


def tensor_child() -> None:
    import torch

    from envs.real.allocator import heap_bytes, steady_malloc, thread_cache_off

    assert steady_malloc()
    faults = []
    for _ in range(9):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b = torch.empty(BLOCK, dtype=torch.uint8).fill_(1)
        del b
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(thread_cache_off(), heap_bytes(), faults[-1])


def model_child(name: str) -> None:
    import torch

    import bench.rank_models as rm
    from envs.real.allocator import heap_bytes, steady_malloc
    from envs.real.timing import adam, default_loss, train_step

    torch.set_num_threads(1)
    assert steady_malloc()
    torch.manual_seed(0)
    model, inputs = getattr(rm, name)()
    optimizer = adam(model.parameters())
    for _ in range(5):
        train_step(model, inputs, optimizer, default_loss)
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        train_step(model, inputs, optimizer, default_loss)
        times.append(time.perf_counter() - t0)
    print(statistics.median(times), heap_bytes())


def run(setting: str, *args: str) -> list[str]:
    env = {**os.environ, "GLIBC_TUNABLES": SETTINGS[setting], "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    copies = {s: [] for s in SETTINGS}
    for _ in range(runs):
        for setting in SETTINGS:
            off, heap, faults = run(setting, "--tensor")
            assert (off == "True") == (setting == "cache off")
            copies[setting].append((int(heap) - (64 << 20)) / BLOCK)
            line = f"{setting:9s} heap {int(heap) >> 20:6d} MiB ({copies[setting][-1]:.1f} copies)"
            print(f"{line}, 9th step faults {faults}", flush=True)
    for setting, c in copies.items():
        over = sum(round(x) > 2 for x in c)  # (a copy and the pad: 1.07 for one)
        print(f"{setting}: copies of the block in the heap, sorted: {sorted(round(x, 1) for x in c)}; over 2: {over}")
    for name in ("lm", "unet", "encoder_decoder"):
        ratios = []
        for _ in range(rounds):
            got = {s: run(s, "--model", name) for s in SETTINGS}
            ratios.append(float(got["cache off"][0]) / float(got["cache on"][0]))
            print(
                name, {s: f"{float(v[0]) * 1e3:.1f} ms, heap {int(v[1]) >> 20} MiB" for s, v in got.items()}, flush=True
            )
        pairs = [round(r, 3) for r in ratios]
        print(f"{name}: step time cache off / on per pair {pairs}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tensor"]:
        tensor_child()
    elif sys.argv[1:2] == ["--model"]:
        model_child(sys.argv[2])
    else:
        main()
