"""Helpers shared by the checkpoint tests (golden paths, reference readers)."""

import pathlib
import pickle
import pickletools
import sys
import types

import numpy as np

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / 'fixtures' / 'golden'
LOOP_MODELS = ('reformerlm_copy', 'reformerlm_lsh', 'transformerlm')
ALL_MODELS = LOOP_MODELS + ('reformerlm_copy_trainer',)


class _FakeShapeDtype:
  """Mimics trax.shapes.ShapeDtype (slots shape, dtype; default pickling)."""
  __slots__ = ['shape', 'dtype']

  def __init__(self, shape, dtype=np.float32):
    self.shape = tuple(shape)
    self.dtype = np.dtype(dtype)


class _FakeHistory:
  """Mimics trax.supervised.history.History (a `_values` dict)."""

  def __init__(self):
    self._values = {}


def install_fake_trax(monkeypatch):
  """Installs modules named like Trax's so the stdlib pickler can write them.

  Lets tests build pickles exactly as Trax's own classes pickle (the real
  `pickle` module names `trax.shapes.ShapeDtype`, etc.), and read pickles with
  the unrestricted stdlib unpickler as an independent reference.
  """
  trax = types.ModuleType('trax')
  shapes = types.ModuleType('trax.shapes')
  supervised = types.ModuleType('trax.supervised')
  history = types.ModuleType('trax.supervised.history')
  _FakeShapeDtype.__module__ = 'trax.shapes'
  _FakeShapeDtype.__name__ = _FakeShapeDtype.__qualname__ = 'ShapeDtype'
  _FakeHistory.__module__ = 'trax.supervised.history'
  _FakeHistory.__name__ = _FakeHistory.__qualname__ = 'History'
  shapes.ShapeDtype = _FakeShapeDtype
  history.History = _FakeHistory
  trax.shapes, trax.supervised, supervised.history = shapes, supervised, history
  for name, mod in (('trax', trax), ('trax.shapes', shapes),
                    ('trax.supervised', supervised),
                    ('trax.supervised.history', history)):
    monkeypatch.setitem(sys.modules, name, mod)
  return types.SimpleNamespace(ShapeDtype=_FakeShapeDtype,
                               History=_FakeHistory)


def _reference_reconstruct_array(fun, args, arr_state, aval_state):
  del aval_state
  value = fun(*args)
  value.__setstate__(arr_state)
  return value


class ReferenceUnpickler(pickle.Unpickler):
  """Unrestricted stdlib unpickler (numpy's own reconstruction) for comparisons."""

  def find_class(self, module, name):
    if (module, name) == ('jax._src.array', '_reconstruct_array'):
      return _reference_reconstruct_array
    if module.startswith('numpy.core'):
      module = 'numpy._core' + module[len('numpy.core'):]
    return super().find_class(module, name)


# What a pickle written for Trax may name: what a Trax 1.4.1 process (numpy
# 1.x) can import -- numpy.core, not numpy._core.
TRAX_IMPORTABLE_GLOBALS = frozenset({
    ('numpy.core.multiarray', '_reconstruct'),
    ('numpy.core.multiarray', 'scalar'), ('numpy', 'ndarray'),
    ('numpy', 'dtype'), ('ml_dtypes', 'bfloat16'),
    ('collections', 'defaultdict'), ('builtins', 'list'),
    ('trax.shapes', 'ShapeDtype')})
_STRING_OPS = ('SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE')


def pickle_globals(data):
  """Every (module, name) a pickle stream imports, found by reading its opcodes.

  Tracks what each opcode pushes (strings, or None for anything else) and the
  memo (MEMOIZE/PUT store the top, GET pushes it back), so STACK_GLOBAL's two
  operands are known without unpickling.
  """
  found, memo, pushed = set(), {}, []
  for op, arg, _ in pickletools.genops(data):
    if op.name in _STRING_OPS:
      pushed.append(arg)
    elif op.name in ('BINGET', 'LONG_BINGET', 'GET'):
      pushed.append(memo.get(int(arg)))
    elif op.name in ('MEMOIZE', 'BINPUT', 'LONG_BINPUT', 'PUT'):
      memo[len(memo) if op.name == 'MEMOIZE' else int(arg)] = (
          pushed[-1] if pushed else None)
    elif op.name == 'GLOBAL':
      found.add(tuple(arg.split(' ', 1)))
      pushed.append(None)
    elif op.name == 'STACK_GLOBAL':
      found.add((pushed[-2], pushed[-1]))
      pushed.append(None)
    else:
      pushed.append(None)
  return found


def readme_reformerlm_copy_tree(n_layers=2, d_model=32, d_ff=128, n_heads=2,
                                d_k=16, vocab=32, max_len=64, lsh=False):
  """The weight tree of `reformerlm_copy`, transcribed from the golden README.

  Leaves are `Shape` records. With `lsh=True`, the attention weights are
  LSHSelfAttention's `(w_qk, w_v, w_o)`, as the README says.
  """
  s = Shape
  ln = lambda d: (s(d), s(d))
  w_in, w_out = s(n_heads, d_model, d_k), s(n_heads, d_k, d_model)
  attention_weights = (w_in, w_in, w_out) if lsh else (w_in, w_in, w_in, w_out)
  attention = (((ln(d_model)),), attention_weights)
  feed_forward = ((ln(d_model), (s(d_model, d_ff), s(d_ff)), (), ((), (), ()),
                   (s(d_ff, d_model), s(d_model)), ()),)
  layer = (attention, (), feed_forward, ())
  return (((), (), ()),
          s(vocab, d_model),
          (),
          ((), s(max_len, d_model), ()),
          (),
          layer * n_layers,
          (),
          ln(2 * d_model),
          (),
          ((), (s(2 * d_model, vocab), s(vocab)), ()))


class Shape:
  """A template leaf with only a shape."""

  def __init__(self, *shape):
    self.shape = tuple(shape)

  def __repr__(self):
    return f'Shape{self.shape}'
