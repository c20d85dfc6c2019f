"""Renderers turn a RankPlan into text another program runs: shell commands, JSON, manifests."""
