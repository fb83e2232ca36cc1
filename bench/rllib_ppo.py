"""Train RLlib's PPO on a placer environment, with env runners on a local Ray or on a Ray cluster.

The recipe for an outside agent on placer's problems: RLlib (Ray's RL library)
runs PPO's env runners as Ray actors, each with its own copy of a Gymnasium
environment of :mod:`placer.gym` (made by id, ``placer.gym:placer/PlaceAll-v0``,
so the runners need placer installed, not this file), and learns in this
process. One iteration samples ``--batch`` placements over the runners, then
takes ``--epochs`` passes of minibatches.

    python -m bench.rllib_ppo --graph nmt-2 --cluster k80x4 --env-runners 2 --iterations 20
    python -m bench.rllib_ppo --graph synthetic/moe-300-s0 --iterations 5 --json
    python -m bench.rllib_ppo --ray-address HEAD_IP:6379 --env-runners 8   # a token-authenticated cluster

Each iteration prints its mean and best episode return and the best step time
found so far on stderr. The best step time is read back from the best return
(the reward is ``-sqrt(step_time_s / t_ref)``, so ``step_time_s = return**2 *
t_ref`` for a placement that fits); after the last iteration the policy's
greedy placement is scored exactly in this process. ``--json`` prints one JSON
document on stdout: every iteration, the placements sampled, the best and
greedy step times, and the command.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, Sequence

import numpy as np

from bench.gym_cli import add_problem, doc_parser, print_report
from graphs import PlacerError

#: The env config every runner makes its environment with (besides graph, cluster and groups).
RUNNER_ENV = {"flatten": True, "peak_memory": False}


def build_parser() -> argparse.ArgumentParser:
    from placer.gym.views import ENV_IDS  # (light: no Ray)

    p = doc_parser("bench.rllib_ppo", __doc__)
    add_problem(p)
    p.add_argument("--env", default="placer/PlaceAll-v0", choices=list(ENV_IDS), help="the environment's view")
    p.add_argument("--groups", type=int, default=None, help="items to place (default: the environment's, 0: ops)")
    p.add_argument("--env-runners", type=int, default=2, help="RLlib env runners, one Ray actor each (default 2)")
    p.add_argument("--iterations", type=int, default=10, help="PPO iterations (default 10)")
    p.add_argument("--batch", type=int, default=256, help="placements sampled per iteration (default 256)")
    p.add_argument("--minibatch", type=int, default=64, help="PPO minibatch size (default 64)")
    p.add_argument("--epochs", type=int, default=4, help="passes over each batch (default 4)")
    # 3e-3: on nmt-2 / k80x4, 8 iterations, the mean return reached -1.131 against -1.190 at 3e-4 and -1.159 at 1e-2
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--entropy", type=float, default=0.0, help="entropy bonus coefficient (default 0)")
    p.add_argument("--hidden", default="256,256", help="hidden layer widths of the policy and value nets")
    p.add_argument("--seed", type=int, default=0, help="seed of RLlib's runners and learner (default 0)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="HEAD_IP:PORT",
        help="join this Ray cluster instead of starting a local one (the README's measured-mode recipe: the "
        "token in ~/.ray/auth_token or RAY_AUTH_TOKEN is sent if the cluster asks); every node needs placer",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return p


def check_args(args: argparse.Namespace) -> None:
    for option, least in (("env_runners", 1), ("iterations", 1), ("batch", 2), ("minibatch", 1), ("epochs", 1)):
        if getattr(args, option) < least:
            raise PlacerError(f"--{option.replace('_', '-')} {getattr(args, option)}: give at least {least}")
    if args.minibatch > args.batch:
        raise PlacerError(f"--minibatch {args.minibatch}: larger than --batch {args.batch}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise PlacerError(f"--lr {args.lr}: give a positive number")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise PlacerError(f"--num-cpus {args.num_cpus}: give at least 1")
    hidden(args.hidden)


def hidden(text: str) -> list[int]:
    widths = [w.strip() for w in text.split(",")]
    if not all(w.isdigit() and int(w) > 0 for w in widths):
        raise PlacerError(f"--hidden {text!r}: give positive widths separated by commas, e.g. 256,256")
    return [int(w) for w in widths]


def env_config(args: argparse.Namespace) -> dict[str, Any]:
    """What each runner's environment is made with."""
    config = {"graph": args.graph, "cluster": args.cluster, **RUNNER_ENV}
    return config if args.groups is None else {**config, "groups": args.groups}


def ppo_config(args: argparse.Namespace) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    widths = hidden(args.hidden)
    return (
        PPOConfig()
        .environment(env=f"placer.gym:{args.env}", env_config=env_config(args))
        .framework("torch")
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=args.batch,
            minibatch_size=args.minibatch,
            num_epochs=args.epochs,
            lr=args.lr,
            entropy_coeff=args.entropy,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=widths, head_fcnet_hiddens=[]))
        # the returns of one iteration's episodes (an episode is one placement in the place-all view)
        .reporting(metrics_num_episodes_for_smoothing=args.batch)
        .debugging(seed=args.seed)
    )


def start_ray(args: argparse.Namespace) -> None:
    import ray

    if args.ray_address is not None:
        from envs.real.measured import join_cluster  # the token logic of the measured env

        join_cluster(args.ray_address)
    else:
        # a Ray of its own: address "local" starts one even where another process's Ray is running on this machine
        # (without it, ray.init may find that one, and then refuses num_cpus)
        ray.init(
            address="local",
            num_cpus=args.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _system_config={"worker_niceness": 0},  # env runners at this process's priority (Ray's default: 15)
        )


def step_time_of(episode_return: float | None, problem: Any) -> float | None:
    """The step time of the placement a place-all episode's return scored (None: no placement that fits)."""
    if episode_return is None or not math.isfinite(episode_return):
        return None
    if episode_return <= -math.sqrt(problem.fail_factor):  # a failed placement's reward, or worse
        return None
    return episode_return**2 * problem.t_ref


def train(args: argparse.Namespace, problem: Any, progress: Any) -> dict[str, Any]:
    """Build PPO, run ``--iterations``, score the greedy placement; the report (without the command)."""
    algo = ppo_config(args).build_algo()
    rows, best_return, t0 = [], -math.inf, time.perf_counter()
    try:
        for i in range(1, args.iterations + 1):
            runners = algo.train()["env_runners"]
            mean, top = _number(runners.get("episode_return_mean")), _number(runners.get("episode_return_max"))
            best_return = max(best_return, top if top is not None else -math.inf)
            row = {
                "iteration": i,
                "episode_return_mean": mean,
                "episode_return_max": top,
                "placements": int(runners.get("num_env_steps_sampled_lifetime", 0)),
                "best_step_time_s": step_time_of(best_return, problem) if args.env.endswith("PlaceAll-v0") else None,
                "wall_s": time.perf_counter() - t0,
            }
            rows.append(row)
            progress(row)
        greedy = greedy_placement(algo, problem, args)
    finally:
        algo.stop()
    first, last = rows[0]["episode_return_mean"], rows[-1]["episode_return_mean"]
    bound = problem.scorer.lower_bound()
    return {
        "graph": args.graph,
        "cluster": args.cluster,
        "env": args.env,
        "env_runners": args.env_runners,
        "t_ref_s": problem.t_ref,
        "lower_bound_s": float(bound),
        "lower_bound_name": getattr(bound, "name", ""),
        "iterations": rows,
        "placements": rows[-1]["placements"],
        "best_step_time_s": rows[-1]["best_step_time_s"],
        "greedy_step_time_s": greedy,
        "first_return_mean": first,
        "last_return_mean": last,
        "improved": bool(first is not None and last is not None and last > first),
        "wall_s": time.perf_counter() - t0,
    }


def _number(x: Any) -> float | None:
    """A metric as a float (RLlib's are numpy scalars), None where there is none."""
    return None if x is None else float(x)


def greedy_placement(algo: Any, problem: Any, args: argparse.Namespace) -> float | None:
    """The step time of the trained policy's most likely placement (the place-all view; None for the others)."""
    if not args.env.endswith("PlaceAll-v0"):
        return None
    import torch
    from ray.rllib.core.columns import Columns

    from placer.gym.views import PlaceAllEnv

    env = PlaceAllEnv(problem.graph, problem.cluster, groups=args.groups, **RUNNER_ENV)
    obs, _ = env.reset(seed=args.seed)
    module = algo.get_module()
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(obs[None])})
    dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    action = np.asarray(dist.to_deterministic().sample()[0])
    _, _, _, _, info = env.step(action.astype(np.int64))
    return None if info["failed"] else float(info["step_time_s"])


def report_line(row: dict[str, Any]) -> str:
    """One iteration on one line (stderr)."""
    line = f"iteration {row['iteration']}: mean return {_shown(row['episode_return_mean'])}, best "
    line += f"{_shown(row['episode_return_max'])}; {row['placements']:,} placements"
    if row["best_step_time_s"] is not None:
        line += f"; best step time {row['best_step_time_s'] * 1e3:.3f} ms"
    return line + f"; {row['wall_s']:.0f} s"


def _shown(x: float | None) -> str:
    return f"{x:.4f}" if x is not None else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        from placer.gym.problem import Problem  # checks the graph and cluster here, before Ray starts

        problem = Problem(args.graph, args.cluster, groups=args.groups, peak_memory=False)
        import ray

        start_ray(args)
        try:
            report = train(args, problem, lambda row: print(report_line(row), file=sys.stderr, flush=True))
        finally:
            ray.shutdown()
    except PlacerError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.json:
        print_report(report, "bench.rllib_ppo", argv)
        return 0
    best, greedy = report["best_step_time_s"], report["greedy_step_time_s"]
    print(
        f"{args.graph} on {args.cluster}, {args.env}: PPO, {args.env_runners} env runners, "
        f"{report['placements']:,} placements in {report['wall_s']:.0f} s"
    )
    print(f"mean return: {report['first_return_mean']:.4f} (iteration 1) -> {report['last_return_mean']:.4f}")
    print(f"best step time: {best * 1e3:.3f} ms" if best is not None else "best step time: none fits")
    print(f"greedy placement: {greedy * 1e3:.3f} ms" if greedy is not None else "greedy placement: none fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
