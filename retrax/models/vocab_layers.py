"""Embedding and output layers whose vocabulary size is checked at init.

Trax's models use their vocabulary size only when the embedding and output
layers initialize, so a model given a wrong one still builds and prints:
`ReformerLM('train')` (the mode passed where the size goes) prints its layer
tree with `Embedding_train_512` and `Dense_train`, and fails at `init`.
retrax's `Embedding` and `Dense` check their sizes when built, so the models
build these two layers through `Embedding` and `Dense` here: a valid size
gives the ordinary layer; anything else gives a stand-in with Trax's name
that raises the size's `ArgumentError` (naming the model and the argument)
when initialized or called.
"""

from retrax.layers import base
from retrax.layers import combinators
from retrax.layers import core
from retrax import validation

_MODES = ('train', 'eval', 'predict')


def _size_error(owner, arg, value):
  """The `ArgumentError` of a bad vocabulary size `value`; None if valid."""
  try:
    validation.check_int(owner, arg, value, 1)
  except validation.ArgumentError as e:
    if isinstance(value, str) and value in _MODES:
      return type(e)(f"{e} '{value}' is a mode: pass it as mode='{value}'.")
    return e
  return None


class _UnbuildableLayer(base.Layer):
  """Stands where a layer could not be built; raises its error when used."""

  def __init__(self, name, error):
    super().__init__(name=name)
    self._error = error

  def _raise(self):
    raise type(self._error)(str(self._error))

  def forward(self, x):
    del x
    self._raise()

  def init_weights_and_state(self, input_signature):
    del input_signature
    self._raise()


def checked_at_init(owner, arg, vocab_size, build, name, in_serial=False):
  """`build()`, or, if `vocab_size` (the argument `arg` of model `owner`) is
  not a valid size, a stand-in called `name` that raises its error at init
  (inside a `Serial` if `in_serial`, as `build` wraps its layer)."""
  error = _size_error(owner, arg, vocab_size)
  if error is None:
    return build()
  stand_in = _UnbuildableLayer(name, error)
  return combinators.Serial(stand_in) if in_serial else stand_in


def Embedding(owner, arg, vocab_size, d_feature, **kwargs):
  """`tl.Embedding(vocab_size, d_feature, **kwargs)`, `vocab_size` (the
  argument `arg` of model `owner`) checked at init."""
  return checked_at_init(
      owner, arg, vocab_size,
      lambda: core.Embedding(vocab_size, d_feature, **kwargs),
      f'Embedding_{vocab_size}_{d_feature}')


def Dense(owner, arg, vocab_size, **kwargs):
  """`tl.Dense(vocab_size, **kwargs)` (logits over the vocabulary),
  `vocab_size` (the argument `arg` of model `owner`) checked at init."""
  return checked_at_init(owner, arg, vocab_size,
                         lambda: core.Dense(vocab_size, **kwargs),
                         f'Dense_{vocab_size}')


def output_arg(output_vocab_size):
  """The argument an encoder-decoder's logits size comes from: its
  `output_vocab_size`, or `input_vocab_size` when that is None."""
  return ('input_vocab_size' if output_vocab_size is None
          else 'output_vocab_size')
