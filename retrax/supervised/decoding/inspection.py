"""What decoding reads off a model (modes, vocabularies, position budgets) and argument checks."""

import jax
import numpy as np

from retrax.layers import core
from retrax.layers import predict_state
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError


def check_mode(model, eval_mode):
  """Raises unless the model's modes suit `eval_mode` (predict mode for fast decoding)."""
  modes = {layer.mode for layer in model.walk()} - {None}
  if eval_mode and 'predict' in modes:
    raise ArgumentValueError(
        "eval_mode=True reruns the whole sequence at every step and needs a "
        "model built with mode='eval'; this model has layers in "
        "mode='predict' (decode it with eval_mode=False).")
  if not eval_mode and 'predict' not in modes:
    raise ArgumentValueError(
        "Fast decoding needs a model built with mode='predict' (its layers "
        "keep caches in model.state); this model's layers are in mode(s) "
        f"{sorted(modes)}. Build it with mode='predict', or pass "
        "eval_mode=True to recompute the full sequence at every step.")


def _positions(layer):
  """`(positions used, positions held)` of a layer's predict-mode state, or None.

  From the layer's declaration (`predict_state`); for an undeclared layer in
  predict mode with an int `max_len`, the last integer scalar of its state
  counts the positions used (the documented fallback).
  """
  state = layer.state
  if not predict_state.has_arrays(state):
    return None
  layout = predict_state.declared_layout(layer, state)
  if layout is not None:
    if layout.max_positions is None:
      return None
    return int(layout.positions_used), layout.max_positions
  if layer.mode != 'predict' or not isinstance(layer.max_len, int):
    return None
  counters = [x for x in jax.tree_util.tree_leaves(state)
              if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype,
                                                   np.integer)]
  return (int(counters[-1]) if counters else 0), layer.max_len


def position_budget(model):
  """`(free positions, description)` of the tightest predict-mode limit, or `(None, '')`."""
  best = (None, '')
  for layer in model.walk():
    positions = _positions(layer)
    if positions is None:
      continue
    used, limit = positions
    if best[0] is None or limit - used < best[0]:
      best = (limit - used, f'{layer.name} holds {limit} positions and '
                            f'{used} are used')
  return best


def check_positions(model, n_prefix, max_length):
  """Raises if the prefix and `max_length` samples do not fit in the caches."""
  free, where = position_budget(model)
  if free is None:
    return
  if n_prefix > free:
    raise ArgumentValueError(
        f'The prompt needs {n_prefix} positions (start symbol, inputs and '
        f'prompt) but the predict-mode caches have {free} free ({where}); '
        'shorten the prompt, reset model.state or build the model with a '
        'larger max_len.')
  n_fed = n_prefix + max_length - 1
  if n_fed > free:
    raise ArgumentValueError(
        f'A {n_prefix}-token prompt and max_length={max_length} feed {n_fed} '
        f'positions but the predict-mode caches have {free} free ({where}); '
        f'use max_length <= {free - n_prefix + 1} or a larger max_len.')


def embedding_vocabs(model):
  """Vocabulary sizes of the first and last `Embedding` (encoder, decoder)."""
  sizes = [layer.vocab_size for layer in model.walk()
           if isinstance(layer, core.Embedding)]
  return (sizes[0], sizes[-1]) if sizes else (None, None)


def check_ids(what, ids, vocab_size):
  """`ids` as int32, checked to be integer token ids in `[0, vocab_size)`."""
  ids = np.asarray(ids)
  if not np.issubdtype(ids.dtype, np.integer):
    raise ArgumentTypeError(f'{what} must hold integer token ids; got dtype '
                            f'{ids.dtype}.')
  if vocab_size is not None and ids.size and (ids.min() < 0 or
                                              ids.max() >= vocab_size):
    raise ArgumentValueError(f'{what} must hold token ids in [0, {vocab_size}) (the '
                             f"model's vocabulary); got ids from {ids.min()} to "
                             f'{ids.max()}.')
  return ids.astype(np.int32)


def tokens_2d(what, x, batch_size):
  """`x` as an array, checked to be `(batch_size, length)`."""
  x = np.asarray(x)
  if x.ndim != 2:
    raise ArgumentValueError(f'{what} must be a 2-D array (batch_size, length); got '
                             f'shape {x.shape}.')
  if x.shape[0] != batch_size:
    raise ArgumentValueError(f'{what} batch size ({x.shape[0]}) does not match '
                             f'batch_size arg ({batch_size}).')
  return x


def check_count(name, value):
  """Raises unless `value` is an int >= 1."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
      value < 1):
    raise ArgumentValueError(f'{name} must be an int >= 1; got {value!r}.')


def _start_ids(start_id, batch_size):
  if np.isscalar(start_id):
    return np.full((batch_size, 1), start_id)
  start = np.asarray(start_id)
  if start.shape != (batch_size, 1):
    raise ArgumentValueError(f'start_id must be an int or an array of shape '
                             f'(batch_size, 1) = {(batch_size, 1)}; got shape '
                             f'{start.shape}.')
  return start


def prepare(model, inputs, prompt, batch_size, start_id, logits_vocab=None):
  """Returns `(prefix (batch, n) int32 starting with the start symbol, encoder inputs or None)`.

  Token ids are checked against the model's vocabulary: `logits_vocab(enc)`
  (the size of its logits, predict mode) or the size of its last `Embedding`
  for decoder tokens, and of its first `Embedding` for encoder inputs.
  """
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ArgumentValueError(f'batch_size must be a positive int; got {batch_size!r}.')
  start = _start_ids(start_id, batch_size)
  if inputs is not None:
    inputs = tokens_2d('Inputs', inputs, batch_size)
  elif model.n_in > 1:
    raise ArgumentValueError(f'This model takes {model.n_in} inputs (an encoder-'
                             'decoder): pass the encoder input as inputs, token ids '
                             'of shape (batch_size, length).')
  if prompt is not None:
    prompt = tokens_2d('Prompt', prompt, batch_size)
  enc_vocab, dec_vocab = embedding_vocabs(model)
  enc = None
  if model.n_in > 1:
    enc = check_ids('inputs', inputs, enc_vocab)
  if logits_vocab is not None:
    dec_vocab = logits_vocab(enc)
  parts = [check_ids('start_id', start, dec_vocab)]
  if model.n_in == 1 and inputs is not None:
    parts.append(check_ids('inputs', inputs, dec_vocab))
  if prompt is not None:
    parts.append(check_ids('prompt', prompt, dec_vocab))
  return np.concatenate(parts, axis=1), enc
