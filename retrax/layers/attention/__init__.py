"""Attention layers: dense attention (Trax's `trax.layers.attention`) and the Reformer's.

This package takes the import path of Trax's `trax.layers.attention` module:
its names (`Attention`, `CausalAttention`, `DotProductCausalAttention`,
`SplitIntoHeads`, ...) are defined in `dense` and importable from here, as
are `ShiftRight`, `PaddingMask`, `EncoderDecoderMask` (defined in
`retrax.layers.core`) and `PositionalEncoding` (in `retrax.layers.position`),
which Trax's module also exported.

Modules:

* `dense`: multi-head dot-product attention, causal attention and its
  predict-mode key/value cache (`kv_cache`).
* `efficient`: the Reformer's memory-efficient `SelfAttention`,
  `EncDecAttention` and `SharedQKDotProductAttention`, on the base class
  `efficient_base.EfficientAttentionBase` (per-head groups, `groups`, with a
  recomputing backward pass) and the array functions of `ops`.
* `lsh`: LSH self-attention (`LSHSelfAttention`).

Trax's `trax.layers.research.efficient_attention` path is
`retrax.layers.research.efficient_attention`, which gathers the efficient
attention layers.
"""

from retrax.layers.attention.dense import Attention as Attention
from retrax.layers.attention.dense import AttentionQKV as AttentionQKV
from retrax.layers.attention.dense import PureAttention as PureAttention
from retrax.layers.attention.dense import dot_product_attention as dot_product_attention
from retrax.layers.attention.dense import DotProductAttention as DotProductAttention
from retrax.layers.attention.dense import SplitIntoHeads as SplitIntoHeads
from retrax.layers.attention.dense import MergeHeads as MergeHeads
from retrax.layers.attention.dense import ConfigurableAttention as ConfigurableAttention
from retrax.layers.attention.dense import CausalAttention as CausalAttention
from retrax.layers.attention.dense import DotProductCausalAttention as DotProductCausalAttention
from retrax.layers.core import EncoderDecoderMask as EncoderDecoderMask
from retrax.layers.core import PaddingMask as PaddingMask
from retrax.layers.core import ShiftRight as ShiftRight
from retrax.layers.position import PositionalEncoding as PositionalEncoding
