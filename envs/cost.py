"""Deprecated alias of envs.sim.cost (kept until the parallel branches merge)."""

from envs.sim.cost import (  # noqa: F401
    BACKWARD_MULTIPLIER,
    OPTIMIZER_STATE_MULTIPLIER,
    UPDATE_TRAFFIC_MULTIPLIER,
    HostCosts,
    activation_bytes,
    bytes_touched,
    copy_costs,
    default_issue_times,
    host_costs,
    issue_times,
    no_host_costs,
    op_times,
    static_bytes,
    transfer_time_s,
    update_bandwidth,
    update_time_s,
    update_times_s,
    update_transient_bytes,
)
