"""Scenario generator and accuracy benchmark for hypocenter.

`bench.generate` writes reproducible corpora of synthetic attempt bundles (contract 1 of
docs/design.md) with a `truth.yaml` ground-truth label each; `bench.accuracy` runs the engine over a
corpus and scores it. The scenarios follow the real log formats, confounders and recipes of
failure modes the emitting programs (NVIDIA driver, NCCL, PyTorch, Slurm, Kubernetes) produce. Nothing in here is imported by the `hypocenter` package,
and nothing in here may read the engine's rules to decide what to write.
"""
