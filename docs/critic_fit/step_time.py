"""The two costs this change cut, each timed side by side with the way it was done before (alternated, medians of
7 repeats, one thread):

* one update of the move critic (26-64-64-1, a batch of 128): autograd's backward and ``torch.optim.Adam`` over the
  six tensors, against :class:`policies.moves.CriticFit` (asserted to give the same weights);
* the planned issue order of a round's placements (a batch of 7 random placements): one
  ``OrderPlanner.schedule_order`` per row with its own sort, as ``SimEnv._batch_order`` did, against
  ``OrderPlanner.schedule_orders`` (asserted to give the same orders).

    PYTHONPATH=. python docs/critic_fit/step_time.py
"""

import statistics
import timeit

import numpy as np
import torch

import envs
from bench.graph_sources import resolve
from policies.moves import NUM_FEATURES, CriticFit, MoveCritic


def per_row_orders(env: envs.SimEnv, op_devices: np.ndarray) -> np.ndarray:
    """The planned orders as before: each row through the dataflow schedule's starts and a sort of its own."""
    host_kinds = np.asarray(env.cluster.kinds) == "cpu"
    dataflow, n = env.with_executor("dataflow"), env.num_ops
    out = []
    for row in op_devices:
        start = dataflow.forward_starts(env.indices(row))[:n]
        out.append(np.lexsort((np.arange(n), host_kinds[row], start)).astype(np.int64))
    return np.stack(out)


def side_by_side(a, b, number: int, repeats: int = 7) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(timeit.timeit(a, number=number) / number)
        tb.append(timeit.timeit(b, number=number) / number)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((128, NUM_FEATURES)).astype(np.float32))
    y = torch.from_numpy((rng.random(128) < 0.1).astype(np.float32))
    torch.manual_seed(0)
    ref = MoveCritic(64)
    optimizer = torch.optim.Adam(ref.parameters(), lr=1e-3)
    torch.manual_seed(0)
    fit = CriticFit(MoveCritic(64), 1e-3)

    def autograd_step() -> None:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    before, after = side_by_side(autograd_step, lambda: fit.step(x, y), number=500)  # the same steps: equal weights
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), fit.critic.state_dict().values()))
    print(
        f"critic update: autograd + Adam {before * 1e3:.3f} ms, CriticFit {after * 1e3:.3f} ms ({before / after:.2f}x)"
    )
    for name, cluster in (("gpt2", "v100x4"), ("inception-v3", "k80x4"), ("nmt-2", "k80x4")):
        env = envs.SimEnv(resolve(name), envs.resolve_cluster(cluster))
        batch = rng.integers(0, env.num_devices, size=(7, env.num_ops))
        assert np.array_equal(per_row_orders(env, batch), env.planner.schedule_orders(batch))
        number = 20 if env.num_ops > 1000 else 200
        before, after = side_by_side(
            lambda: per_row_orders(env, batch), lambda: env.planner.schedule_orders(batch), number=number
        )
        print(
            f"planned orders, {name} ({env.num_ops} ops), {cluster}: per row {before / 7 * 1e6:.1f} us before, "
            f"{after / 7 * 1e6:.1f} us after, {before / after:.2f}x"
        )


if __name__ == "__main__":
    main()
