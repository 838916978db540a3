"""Trax's `layers.research.efficient_attention` module path.

The layers are defined in `retrax.layers.attention.efficient` (SelfAttention,
EncDecAttention), `retrax.layers.attention.lsh` (LSHSelfAttention),
`retrax.layers.attention.efficient_base` and `..._ops` (the shared helpers);
this module gathers them under Trax's name.
"""

from retrax.layers.attention.efficient import EncDecAttention as EncDecAttention
from retrax.layers.attention.efficient import SelfAttention as SelfAttention
from retrax.layers.attention.efficient_base import EfficientAttentionBase as EfficientAttentionBase
from retrax.layers.attention.ops import apply_broadcasted_dropout as apply_broadcasted_dropout
from retrax.layers.attention.ops import attend as attend
from retrax.layers.attention.ops import hash_vecs as hash_vecs
from retrax.layers.attention.ops import length_normalized as length_normalized
from retrax.layers.attention.ops import look_adjacent as look_adjacent
from retrax.layers.attention.ops import mask_self_attention as mask_self_attention
from retrax.layers.attention.ops import permute_via_gather as permute_via_gather
from retrax.layers.attention.ops import permute_via_sort as permute_via_sort
from retrax.layers.attention.lsh import LSHSelfAttention as LSHSelfAttention
from retrax.layers.research.lsh_ff import LSHFF as LSHFF
from retrax.layers.research.pure_lsh_attention import PureLSHSelfAttention as PureLSHSelfAttention
from retrax.layers.research.pure_lsh_wrapper import MixedLSHSelfAttention as MixedLSHSelfAttention
from retrax.layers.research.pure_lsh_wrapper import PureLSHSelfAttentionWrapper as PureLSHSelfAttentionWrapper
