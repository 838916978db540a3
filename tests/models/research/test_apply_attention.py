"""ApplyAttentionLayer picks the efficient or dense signature by reading the
attention type's parameters, not by retrying after a TypeError."""

import functools
import inspect

import pytest

from retrax import layers as tl
from retrax.models.research import configurable_transformer as ct

_ARGS = dict(d_model=16, n_heads=2, d_qk=8, d_v=8, causal=True, masked=False,
             attention_dropout=0.0, output_dropout=0.0,
             attention_chunk_size=0, mode='eval')


def _calls(layer_fn):
  """(a wrapper of `layer_fn` with its signature, [(args, kwargs) per call])."""
  seen = []

  def spy(*args, **kwargs):
    seen.append((args, kwargs))
    return layer_fn(*args, **kwargs)
  spy.__signature__ = inspect.signature(layer_fn)
  return spy, seen


def test_dense_attention_gets_d_feature_first():
  spy, seen = _calls(tl.CausalAttention)
  ct.ApplyAttentionLayer(spy, **_ARGS)
  assert seen == [((16,), dict(n_heads=2, dropout=0.0, mode='eval'))]


@pytest.mark.parametrize('attention_type', [
    tl.SelfAttention, functools.partial(tl.LSHSelfAttention, chunk_len=4)])
def test_efficient_attention_gets_keywords(attention_type):
  layer = ct.ApplyAttentionLayer(attention_type, **_ARGS)
  assert layer.n_in == 1 and 'Attention' in layer.name


def test_a_type_error_inside_efficient_attention_is_not_retried_as_dense():
  def attention(**kwargs):
    raise TypeError(f'my bug ({sorted(kwargs)[0]})')
  with pytest.raises(TypeError, match=r'my bug \(attention_dropout\)'):
    ct.ApplyAttentionLayer(attention, **_ARGS)
