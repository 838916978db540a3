"""retrax.layers.research: Trax's `trax.layers.research` modules, at their paths.

`efficient_attention`, `position_encodings` and `sparsity` hold the research
layers; the ones Trax also exports from `trax.layers` are in `retrax.layers`.
"""
