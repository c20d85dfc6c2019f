"""Backends launch and stop the ranks of a RankPlan somewhere: this machine, SSH hosts, k8s."""
