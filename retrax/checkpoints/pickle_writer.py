"""A small pickle emitter that writes only the globals Trax's readers need.

Python's pickler names each object's own class: a numpy 2 array becomes
`numpy._core.multiarray._reconstruct` (which numpy 1.x, and so Trax 1.4.1,
cannot import), and a record cannot claim to be `trax.shapes.ShapeDtype`
unless Trax is installed. This module emits protocol-4 opcodes directly, so the
stream references exactly these globals:

  numpy.core.multiarray._reconstruct, numpy.core.multiarray.scalar,
  numpy.ndarray, numpy.dtype, ml_dtypes.<type> (e.g. bfloat16),
  collections.defaultdict, builtins.list/dict/..., trax.shapes.ShapeDtype

Supported values: None, bool, int, float, str, bytes, tuple, list, dict,
`collections.defaultdict` (builtin factory), numpy arrays and scalars, other
arrays convertible by `numpy.asarray` (jax arrays), and `ShapeDtype`-like
records. Anything else raises `TypeError` naming its path in the object.
"""

import collections
import io
import struct
from typing import Any, Dict

import numpy as np

from retrax.checkpoints.records import is_shape_dtype
from retrax.checkpoints.safe_unpickle import check_dtype
from retrax.validation import ArgumentTypeError

_PROTO = b'\x80'
_STOP = b'.'
_NONE = b'N'
_TRUE = b'\x88'
_FALSE = b'\x89'
_BININT1 = b'K'
_BININT2 = b'M'
_BININT = b'J'
_LONG1 = b'\x8a'
_LONG4 = b'\x8b'
_BINFLOAT = b'G'
_SHORT_BINUNICODE = b'\x8c'
_BINUNICODE = b'X'
_BINUNICODE8 = b'\x8d'
_SHORT_BINBYTES = b'C'
_BINBYTES = b'B'
_BINBYTES8 = b'\x8e'
_EMPTY_TUPLE = b')'
_TUPLE1 = b'\x85'
_TUPLE2 = b'\x86'
_TUPLE3 = b'\x87'
_MARK = b'('
_TUPLE = b't'
_EMPTY_LIST = b']'
_APPENDS = b'e'
_EMPTY_DICT = b'}'
_SETITEMS = b'u'
_STACK_GLOBAL = b'\x93'
_REDUCE = b'R'
_BUILD = b'b'
_NEWOBJ = b'\x81'

_BUILTIN_FACTORIES: Dict[Any, str] = {list: 'list', dict: 'dict', tuple: 'tuple', set: 'set',
                      int: 'int', float: 'float', str: 'str'}


class _Emitter:
  """Writes pickle opcodes for one object tree into `out`."""

  def __init__(self, out):
    self._out = out

  def _w(self, data):
    self._out.write(data)

  def dump(self, obj):
    self._w(_PROTO + bytes([4]))
    self._save(obj, ())
    self._w(_STOP)

  def _global(self, module, name):
    self._str(module)
    self._str(name)
    self._w(_STACK_GLOBAL)

  def _str(self, s):
    data = s.encode('utf-8', 'surrogatepass')
    n = len(data)
    if n < 256:
      self._w(_SHORT_BINUNICODE + bytes([n]) + data)
    elif n < 2**32:
      self._w(_BINUNICODE + struct.pack('<I', n) + data)
    else:
      self._w(_BINUNICODE8 + struct.pack('<Q', n) + data)

  def _bytes(self, b):
    n = len(b)
    if n < 256:
      self._w(_SHORT_BINBYTES + bytes([n]) + b)
    elif n < 2**32:
      self._w(_BINBYTES + struct.pack('<I', n) + b)
    else:
      self._w(_BINBYTES8 + struct.pack('<Q', n) + b)

  def _int(self, i):
    if 0 <= i < 256:
      self._w(_BININT1 + bytes([i]))
    elif 0 <= i < 65536:
      self._w(_BININT2 + struct.pack('<H', i))
    elif -2**31 <= i < 2**31:
      self._w(_BININT + struct.pack('<i', i))
    else:
      data = i.to_bytes((i.bit_length() + 8) // 8, 'little', signed=True)
      if len(data) < 256:
        self._w(_LONG1 + bytes([len(data)]) + data)
      else:
        self._w(_LONG4 + struct.pack('<i', len(data)) + data)

  def _tuple(self, items, path):
    if not items:
      self._w(_EMPTY_TUPLE)
      return
    if len(items) <= 3:
      for i, x in enumerate(items):
        self._save(x, path + (i,))
      self._w((_TUPLE1, _TUPLE2, _TUPLE3)[len(items) - 1])
      return
    self._w(_MARK)
    for i, x in enumerate(items):
      self._save(x, path + (i,))
    self._w(_TUPLE)

  def _setitems(self, d, path):
    if d:
      self._w(_MARK)
      for k, v in d.items():
        self._save(k, path + ('<key>',))
        self._save(v, path + (k,))
      self._w(_SETITEMS)

  def _dtype(self, dtype, path):
    check_dtype(dtype)
    _, args, state = dtype.__reduce__()
    self._global('numpy', 'dtype')
    kind = args[0]
    if isinstance(kind, str):
      self._str(kind)
    else:  # An ml_dtypes scalar type, e.g. bfloat16.
      self._global('ml_dtypes', kind.__name__)
    self._w(_FALSE + _TRUE + _TUPLE3 + _REDUCE)
    self._save(state, path)
    self._w(_BUILD)

  def _array(self, arr, path):
    self._global('numpy.core.multiarray', '_reconstruct')
    self._global('numpy', 'ndarray')
    self._int(0)
    self._w(_TUPLE1)
    self._bytes(b'b')
    self._w(_TUPLE3 + _REDUCE)
    # State (version, shape, dtype, is_fortran, raw bytes), as numpy writes it.
    self._w(_MARK)
    self._int(1)
    self._tuple(tuple(int(d) for d in arr.shape), path)
    self._dtype(arr.dtype, path)
    self._w(_FALSE)
    self._bytes(arr.tobytes(order='C'))
    self._w(_TUPLE + _BUILD)

  def _numpy_scalar(self, x, path):
    self._global('numpy.core.multiarray', 'scalar')
    self._dtype(x.dtype, path)
    self._bytes(x.tobytes())
    self._w(_TUPLE2 + _REDUCE)

  def _shape_dtype(self, x, path):
    self._global('trax.shapes', 'ShapeDtype')
    self._w(_EMPTY_TUPLE + _NEWOBJ)
    # Trax's ShapeDtype has __slots__: the state is (None, {slot: value}).
    self._w(_NONE)
    self._w(_EMPTY_DICT)
    shape = tuple(None if d is None else int(d) for d in x.shape)
    self._setitems({'shape': shape, 'dtype': np.dtype(x.dtype)}, path)
    self._w(_TUPLE2 + _BUILD)

  def _save(self, x, path):
    if x is None:
      self._w(_NONE)
    elif x is True:
      self._w(_TRUE)
    elif x is False:
      self._w(_FALSE)
    elif type(x) is int:
      self._int(x)
    elif type(x) is float:
      self._w(_BINFLOAT + struct.pack('>d', x))
    elif type(x) is str:
      self._str(x)
    elif type(x) is bytes:
      self._bytes(x)
    elif isinstance(x, np.dtype):
      self._dtype(x, path)
    elif isinstance(x, np.ndarray):
      self._array(x, path)
    elif isinstance(x, np.generic):
      self._numpy_scalar(x, path)
    elif is_shape_dtype(x):
      self._shape_dtype(x, path)
    elif isinstance(x, tuple) and type(x) is tuple:
      self._tuple(x, path)
    elif type(x) is list:
      self._w(_EMPTY_LIST)
      if x:
        self._w(_MARK)
        for i, y in enumerate(x):
          self._save(y, path + (i,))
        self._w(_APPENDS)
    elif type(x) is collections.defaultdict:
      factory = _BUILTIN_FACTORIES.get(x.default_factory)
      if factory is None:
        raise ArgumentTypeError(
            f'cannot write defaultdict with factory {x.default_factory!r} at '
            f'{_where(path)}; only builtin container/number factories.')
      self._global('collections', 'defaultdict')
      self._global('builtins', factory)
      self._w(_TUPLE1 + _REDUCE)
      self._setitems(x, path)
    elif type(x) is dict:
      self._w(_EMPTY_DICT)
      self._setitems(x, path)
    elif hasattr(x, '__array__') and hasattr(x, 'dtype'):  # e.g. jax arrays.
      self._array(np.asarray(x), path)
    else:
      raise ArgumentTypeError(
          f'cannot write a {type(x).__module__}.{type(x).__qualname__} at '
          f'{_where(path)} into a Trax checkpoint; only arrays, numbers, '
          f'strings, builtin containers and ShapeDtype are supported.')


def _where(path):
  return '<root>' + ''.join(f'[{p!r}]' for p in path)


def dump(obj, fileobj):
  """Writes `obj` as a pickle that references only Trax-compatible globals."""
  _Emitter(fileobj).dump(obj)


def dumps(obj):
  """Returns `obj` pickled like `dump`."""
  out = io.BytesIO()
  dump(obj, out)
  return out.getvalue()
