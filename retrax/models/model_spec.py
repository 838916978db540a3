"""What a run's `model.json` may name: a model constructor and its arguments.

A `model.json` is data that travels with a run directory, and `load_run`,
`retrax sample` and `retrax eval` build the model it describes. So it may
name only a `retrax.models` constructor, only arguments that constructor
takes, and a layer only as the value of an argument that takes one, and
only a layer of that argument's kind (`LAYER_ARGUMENTS`: an activation for
`ff_activation`, an attention layer for `attention_type`, ...), with only
that layer's own arguments. Everything else is plain JSON data. Without
this, a crafted file could put any weightless layer into the architecture
(`PrintShape` as `ff_activation` loads, and prints on every call).

`check_kwargs` works on the JSON form that `models.registry` records: plain
values, `{'tuple': [...]}`, `{'dict': {...}}` and
`{'layer': name, 'kwargs': {...}}` (or a list of these, for arguments
such as ReformerLM's `attention_type` that cycle layers). `models.registry`
applies it too, so a model whose arguments it refuses records no
constructor rather than a file that would not load.
"""

import inspect

from retrax import layers as tl
from retrax.errors import UserInputError

_ACTIVATIONS = frozenset((
    'Elu', 'FastGelu', 'Gelu', 'HardSigmoid', 'HardTanh', 'LeakyRelu',
    'ParametricRelu', 'Relu', 'Selu', 'Sigmoid', 'Softplus', 'Swish', 'Tanh',
    'ThresholdedLinearUnit'))
_ATTENTIONS = frozenset((
    'Attention', 'CausalAttention', 'CausalFavorAttention',
    'ConvCausalAttention', 'EncDecAttention', 'FavorAttention',
    'LowRankCausalAttention', 'LSHSelfAttention', 'MixedLSHSelfAttention',
    'ModularCausalAttention', 'MultiplicativeCausalAttention',
    'MultiplicativeConvCausalAttention', 'MultiplicativeModularCausalAttention',
    'PureLSHSelfAttention', 'PureLSHSelfAttentionWrapper',
    'RelativeAttentionLMLayer', 'RelativeAttentionWrapper', 'SelfAttention'))
_RESAMPLING = frozenset((
    'AttentionResampling', 'AveragePooling', 'LinearPooling',
    'LinearUpsampling', 'NaiveUpsampling', 'NoUpsampling'))
# Model arguments that take a layer constructor, and which ones.
LAYER_ARGUMENTS = {
    'activation_fn': _ACTIVATIONS,
    'out_activation': _ACTIVATIONS,
    'ff_activation': _ACTIVATIONS,
    'non_linearity': _ACTIVATIONS,
    'attention_type': _ATTENTIONS,
    'encoder_attention_type': _ATTENTIONS,
    'decoder_attention_type': _ATTENTIONS,
    'encoder_decoder_attention_type': _ATTENTIONS,
    'vanilla_attn_type': _ATTENTIONS,
    'middle_attn_type': _ATTENTIONS,
    'downsampling_fn': _RESAMPLING,
    'upsampling_fn': _RESAMPLING,
    'attention_downsampling_fn': _RESAMPLING,
    'attention_upsampling_fn': _RESAMPLING,
    'norm': frozenset(('BatchNorm', 'FilterResponseNorm', 'LayerNorm')),
    'rnn_cell': frozenset(('GRUCell', 'LSTMCell')),
}


class ModelFileError(UserInputError):
  """A `model.json` that cannot be used: unreadable, or naming something a
  model file may not name."""


def _parameters(fn):
  """`(names, takes **kwargs)` of callable `fn`'s signature."""
  params = inspect.signature(inspect.unwrap(fn)).parameters.values()
  return ({p.name for p in params},
          any(p.kind is p.VAR_KEYWORD for p in params))


def _check_names(fn, names, what, where):
  known, any_name = _parameters(fn)
  unknown = sorted(n for n in names if not isinstance(n, str) or (
      n not in known and not any_name) or n == 'mode')
  if unknown:
    raise ModelFileError(f'{where}: {what} takes no argument(s) {unknown}.')


def _check_plain(value, where):
  """Plain JSON data: no layer anywhere inside."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return
  if isinstance(value, list):
    for x in value:
      _check_plain(x, where)
    return
  if isinstance(value, dict) and len(value) == 1:
    [(kind, inner)] = value.items()
    if kind == 'tuple' and isinstance(inner, list):
      return _check_plain(inner, where)
    if kind == 'dict' and isinstance(inner, dict):
      return _check_plain(list(inner.values()), where)
  raise ModelFileError(f'{where}: {str(value)[:80]!r} is not a value a model '
                       'file may hold here (only numbers, strings, lists, '
                       'tuples and dicts; layers only for layer arguments).')


def _check_layer(arg, value, where):
  """A `{'layer': name, 'kwargs': {...}}` value of model argument `arg`."""
  name, kwargs = value.get('layer'), value.get('kwargs', {})
  allowed = LAYER_ARGUMENTS.get(arg, frozenset())
  if name not in allowed or set(value) - {'layer', 'kwargs'}:
    takes = (f'one of {", ".join(sorted(allowed))}' if allowed else
             'no layer')
    raise ModelFileError(f'{where}: argument {arg!r} cannot be layer '
                         f'{str(name)[:40]!r}; it takes {takes}.')
  if not isinstance(kwargs, dict):
    raise ModelFileError(f'{where}: the arguments of layer {name} are not a '
                         'dict.')
  _check_names(getattr(tl, name), kwargs, name, where)
  _check_plain(list(kwargs.values()), where)


def check_kwargs(fn, kwargs, where):
  """Checks the JSON-form arguments `kwargs` of model constructor `fn`.

  Raises:
    ModelFileError: an argument `fn` does not take, a layer where none is
      taken or of another kind, or a layer argument its layer does not take.
  """
  if not isinstance(kwargs, dict):
    raise ModelFileError(f'{where}: the constructor arguments are not a dict.')
  _check_names(fn, kwargs, fn.__name__, where)
  for arg, value in kwargs.items():
    if isinstance(value, dict) and 'layer' in value:
      _check_layer(arg, value, where)
    elif _is_layer_list(value) and arg in LAYER_ARGUMENTS:
      for layer in value:  # E.g. ReformerLM's attention types, cycled.
        _check_layer(arg, layer, where)
    else:
      _check_plain(value, where)


def _is_layer_list(value):
  return (isinstance(value, list) and bool(value) and
          all(isinstance(x, dict) and 'layer' in x for x in value))
