"""The PyMC adapter: model to per-observation likelihood, proposals, tuning, stats, compat."""
