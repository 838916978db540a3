"""A restricted unpickler for Trax checkpoints: data in, no code run.

`pickle.load` calls whatever global a file names, so a checkpoint from an
untrusted place can run any code. `RestrictedUnpickler` resolves globals from
a fixed table instead: numpy array/scalar/dtype reconstruction (under both the
numpy 1.x `numpy.core` and numpy 2.x `numpy._core` paths), jax's
`_reconstruct_array`, `collections.defaultdict`/`OrderedDict`, plain builtin
types, numpy's and ml_dtypes' numeric scalar types (a `ShapeDtype` made with
`np.int32` pickles the type), and Trax's `ShapeDtype` and `History`, which
become the records of `retrax.checkpoints.records`. Each table entry is a
small function written here that validates its arguments (no object dtypes,
no structured dtypes, raw bytes only), so even an admitted name cannot be
steered into running code. Any other global raises `UnsafeCheckpointError`
before it is imported.
"""

import builtins
import collections
import functools
import io
import pickle
from typing import Any, Callable, Dict, Tuple

import numpy as np

from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import UnsafeCheckpointError
from retrax.checkpoints.records import TraxHistory
from retrax.checkpoints.records import TraxShapeDtype

_ML_DTYPE_NAMES = (
    'bfloat16', 'float8_e4m3fn', 'float8_e4m3fnuz', 'float8_e4m3b11fnuz',
    'float8_e5m2', 'float8_e5m2fnuz', 'float8_e3m4', 'float8_e4m3',
    'float8_e8m0fnu', 'int4', 'uint4', 'int2', 'uint2')


@functools.lru_cache(maxsize=None)
def _ml_dtype_types():
  import ml_dtypes
  return {name: getattr(ml_dtypes, name) for name in _ML_DTYPE_NAMES
          if hasattr(ml_dtypes, name)}


def check_dtype(dtype):
  """Raises `UnsafeCheckpointError` unless `dtype` is a plain numeric/string dtype."""
  if not isinstance(dtype, np.dtype):
    raise UnsafeCheckpointError(
        f'expected a numpy dtype in the checkpoint, got {type(dtype).__name__}.')
  if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
    raise UnsafeCheckpointError(
        f'refused dtype {dtype!r}: object and structured dtypes are not '
        f'admitted in checkpoints.')
  if dtype.kind in 'biufc?mM':
    return dtype
  if dtype.kind in 'SU' and dtype.itemsize > 0:
    return dtype
  if dtype.type in _ml_dtype_types().values():
    return dtype
  raise UnsafeCheckpointError(f'refused dtype {dtype!r} in checkpoint.')


def _check_shape(shape):
  if not isinstance(shape, tuple) or not all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
    raise CheckpointFormatError(
        f'array shape must be a tuple of non-negative ints; got {shape!r}.')
  return shape


class _NdarrayToken:
  """Stands for `numpy.ndarray` as an argument of `_reconstruct`; not callable."""

  __slots__ = ()

  def __call__(self, *args, **kwargs):
    raise UnsafeCheckpointError(
        'refused call of numpy.ndarray(...): only numpy\'s own array '
        'reconstruction is admitted.')

  def __repr__(self):
    return '<numpy.ndarray token>'


_NDARRAY = _NdarrayToken()


class _GuardedArray(np.ndarray):
  """An ndarray whose `__setstate__` (pickle's BUILD) validates the state."""

  def __setstate__(self, state):
    if not isinstance(state, tuple) or len(state) not in (4, 5):
      raise CheckpointFormatError(f'malformed ndarray state {state!r:.200}.')
    shape, dtype, _, raw = state[-4:]
    _check_shape(shape)
    check_dtype(dtype)
    if not isinstance(raw, (bytes, bytearray)):
      raise UnsafeCheckpointError(
          'refused ndarray state whose data is not raw bytes (object arrays '
          'are not admitted).')
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
      raise CheckpointCorruptedError(
          f'ndarray of shape {shape} and dtype {dtype} needs {expected} bytes, '
          f'the checkpoint holds {len(raw)}.')
    super().__setstate__(state)


def _reconstruct(subtype, shape, typecode):
  """Safe `numpy.core.multiarray._reconstruct`: an empty array awaiting BUILD."""
  del shape, typecode  # numpy always passes (0,), b'b'; BUILD sets the real ones.
  if subtype is not _NDARRAY:
    raise UnsafeCheckpointError(
        f'refused _reconstruct of {subtype!r}: only numpy.ndarray is admitted.')
  return np.ndarray.__new__(_GuardedArray, (0,), np.uint8)


def _scalar(dtype, data=None):
  """Safe `numpy.core.multiarray.scalar`: a numpy scalar from raw bytes."""
  check_dtype(dtype)
  if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
    raise UnsafeCheckpointError(
        f'refused numpy scalar of dtype {dtype}: data must be '
        f'{dtype.itemsize} raw bytes.')
  return np.frombuffer(bytes(data), dtype=dtype)[0]


def _frombuffer(buf, dtype, shape, order):
  """Safe `numpy.core.numeric._frombuffer` (numpy's protocol-5 array reducer)."""
  check_dtype(dtype)
  _check_shape(shape)
  if isinstance(buf, pickle.PickleBuffer):
    buf = bytes(buf.raw())
  if not isinstance(buf, (bytes, bytearray)) or order not in ('C', 'F'):
    raise UnsafeCheckpointError('refused _frombuffer with non-bytes data.')
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(buf) != expected:
    raise CheckpointCorruptedError(
        f'array of shape {shape} and dtype {dtype} needs {expected} bytes, the '
        f'checkpoint holds {len(buf)}.')
  return np.frombuffer(bytes(buf), dtype=dtype).reshape(shape, order=order).copy()


def _dtype(obj, align=False, copy=True):
  """Safe `numpy.dtype(...)`: from a type string or an ml_dtypes type only."""
  del copy  # Always copy: BUILD then mutates the copy, never numpy's singleton.
  if isinstance(obj, str):
    if ',' in obj or '[' in obj or '(' in obj:
      raise UnsafeCheckpointError(f'refused structured dtype {obj!r}.')
  elif obj not in _ml_dtype_types().values():
    raise UnsafeCheckpointError(f'refused dtype argument {obj!r}.')
  try:
    dtype = np.dtype(obj, align=bool(align), copy=True)
  except TypeError as e:
    raise CheckpointFormatError(f'invalid dtype {obj!r}: {e}') from None
  return check_dtype(dtype)


# numpy's numeric scalar types, named as `pickle` names them (`numpy.int32`).
_NUMPY_SCALAR_TYPE_NAMES = (
    'bool_', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
    'uint64', 'float16', 'float32', 'float64', 'longdouble', 'complex64',
    'complex128', 'clongdouble')


def _numpy_scalar_types():
  """Maps `('numpy', name)` of each numeric scalar type to its dtype."""
  types = {('numpy', name): np.dtype(getattr(np, name))
           for name in _NUMPY_SCALAR_TYPE_NAMES}
  # numpy 1.x pickles bool_ as `numpy.bool_`, numpy 2.x as `numpy.bool`.
  types[('numpy', 'bool')] = types[('numpy', 'bool_')]
  return types


_SCALAR_TYPES = _numpy_scalar_types()


def _jax_reconstruct_array(fun, args, arr_state, aval_state=None):
  """Safe `jax._src.array._reconstruct_array`: returns a numpy array."""
  del aval_state  # weak_type etc.: irrelevant for stored values.
  if fun is not _SAFE_RECONSTRUCT or not isinstance(args, tuple):
    raise UnsafeCheckpointError(
        f'refused jax array reconstruction through {fun!r}.')
  array = _reconstruct(*args)
  array.__setstate__(arr_state)
  return array


def _bytes(*args):
  """Safe `bytes(...)`: refuses `bytes(n)`, which would allocate n bytes."""
  if args and isinstance(args[0], int):
    raise UnsafeCheckpointError('refused bytes(<int>) in checkpoint.')
  return bytes(*args)


_DEFAULT_FACTORIES = (None, list, dict, tuple, set, int, float, str)


def _defaultdict(default_factory=None, *args):
  if not any(default_factory is f for f in _DEFAULT_FACTORIES):
    raise UnsafeCheckpointError(
        f'refused defaultdict with factory {default_factory!r}.')
  return collections.defaultdict(default_factory, *args)


class _SafeCallable:
  """A table entry: calls `fn`; pickle's BUILD cannot alter it (no attributes)."""

  __slots__ = ('_fn', '_name')
  _fn: Callable[..., Any]
  _name: str

  def __init__(self, fn, name):
    object.__setattr__(self, '_fn', fn)
    object.__setattr__(self, '_name', name)

  def __call__(self, *args):
    return self._fn(*args)

  def __setattr__(self, name, value):
    raise UnsafeCheckpointError(f'refused attribute change on {self._name}.')

  def __setstate__(self, state):
    raise UnsafeCheckpointError(f'refused BUILD on {self._name}.')

  def __repr__(self):
    return f'<restricted {self._name}>'


def _allowed_globals():
  """Maps each admitted (module, name) to the object the unpickler gets."""
  safe = {
      ('numpy', 'dtype'): _dtype,
      ('jax._src.array', '_reconstruct_array'): _jax_reconstruct_array,
      ('collections', 'defaultdict'): _defaultdict,
      ('builtins', 'bytes'): _bytes,
  }
  for core in ('numpy.core', 'numpy._core'):
    for mod in ('multiarray', '_multiarray_umath'):
      safe[(f'{core}.{mod}', '_reconstruct')] = _reconstruct
      safe[(f'{core}.{mod}', 'scalar')] = _scalar
    safe[(f'{core}.numeric', '_frombuffer')] = _frombuffer
  wrapped = {fn: _SafeCallable(fn, f'{m}.{n}') for (m, n), fn in safe.items()}
  table: Dict[Tuple[str, str], Any] = {
      key: wrapped[fn] for key, fn in safe.items()}
  table.update({
      ('numpy', 'ndarray'): _NDARRAY,
      ('collections', 'OrderedDict'): collections.OrderedDict,
      ('trax.shapes', 'ShapeDtype'): TraxShapeDtype,
      ('trax.supervised.history', 'History'): TraxHistory,
  })
  for name in ('list', 'tuple', 'dict', 'set', 'frozenset', 'int', 'float',
               'complex', 'str', 'bool', 'slice'):
    table[('builtins', name)] = getattr(builtins, name)
  for name, typ in _ml_dtype_types().items():
    table[('ml_dtypes', name)] = typ
  return table, wrapped[_reconstruct]


_TABLE, _SAFE_RECONSTRUCT = _allowed_globals()
ALLOWED_GLOBALS = frozenset(_TABLE) | frozenset(_SCALAR_TYPES)


class RestrictedUnpickler(pickle.Unpickler):
  """`pickle.Unpickler` that resolves only the globals in `ALLOWED_GLOBALS`."""

  def find_class(self, module, name):
    if (module, name) in _SCALAR_TYPES:
      # The dtype, not the type: a type is callable, so a pickle could feed it
      # arguments; a fresh dtype copy is inert, equals the type
      # (`np.dtype('int32') == np.int32`), and is what `ShapeDtype` holds.
      return np.dtype(_SCALAR_TYPES[(module, name)], copy=True)
    try:
      return _TABLE[(module, name)]
    except KeyError:
      raise UnsafeCheckpointError(
          f"refused global '{module}.{name}': a Trax checkpoint only needs "
          f'numpy arrays, builtin containers and trax ShapeDtype/History; '
          f'this file was not written by Trax or has been tampered with. '
          f'The global was neither imported nor called.') from None

  def persistent_load(self, pid):
    raise UnsafeCheckpointError(
        f'refused persistent id {pid!r:.80}: not used by Trax checkpoints.')


def safe_load(fileobj):
  """Unpickles from a binary file object with `RestrictedUnpickler`.

  Returns:
    The object, with arrays as plain `numpy.ndarray`s, Trax `ShapeDtype`s as
    `TraxShapeDtype` and Trax `History` as `TraxHistory`.

  Raises:
    UnsafeCheckpointError: the pickle names a global outside the allowed set.
    CheckpointCorruptedError: the stream is truncated or malformed.
  """
  try:
    obj = RestrictedUnpickler(fileobj).load()
  except (UnsafeCheckpointError, CheckpointFormatError):
    raise
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError,
          IndexError, AttributeError, MemoryError, OSError) as e:
    raise CheckpointCorruptedError(
        f'could not unpickle the checkpoint ({type(e).__name__}: {e}); the '
        f'file is truncated or corrupted.') from None
  try:
    return _finalize(obj, {})
  except RecursionError:
    raise CheckpointFormatError('checkpoint nesting is too deep.') from None


def safe_loads(data):
  """`safe_load` from bytes."""
  return safe_load(io.BytesIO(data))


def _finalize(x, seen):
  """Turns guarded arrays into plain ndarrays; validates dtypes in records."""
  if isinstance(x, _GuardedArray):
    return x.view(np.ndarray)
  if id(x) in seen:
    return seen[id(x)]
  if isinstance(x, list):
    seen[id(x)] = x
    x[:] = [_finalize(y, seen) for y in x]
  elif isinstance(x, tuple):
    out = tuple(_finalize(y, seen) for y in x)
    seen[id(x)] = out
    return out
  elif isinstance(x, dict):
    seen[id(x)] = x
    for k in list(x):
      x[k] = _finalize(x[k], seen)
  elif isinstance(x, TraxHistory):
    seen[id(x)] = x
    x.values = _finalize(x.values, seen)
  elif isinstance(x, TraxShapeDtype):
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
      raise CheckpointFormatError('a ShapeDtype in the checkpoint has no state.')
    check_dtype(x.dtype)
  elif isinstance(x, np.dtype):
    check_dtype(x)
  return x
