"""Sandblaster L-BFGS (DistBelief, seed 004): a coordinator-driven batch method.

``lbfgs`` is the optimizer: two-loop L-BFGS with an Armijo line search, run as vector operations
on the shards. ``balancer`` hands the passes' data portions to workers, with backup copies of
the slowest ones.
"""
