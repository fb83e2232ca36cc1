"""The pretrained gnn policy shipped with placer (gnn-default.pt + .json); see policies.policy_file."""
