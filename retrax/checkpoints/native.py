"""retrax's native checkpoint format: safetensors arrays + JSON metadata, no pickle.

A checkpoint is a directory holding two files:

  arrays.<sha256-prefix>.safetensors   every array leaf, keyed by its path in
                                       its tree, `<tree>/<i>/<j>/...` (for
                                       weights: the layer path, e.g.
                                       `weights/1/0/2`; files written before
                                       numbered them `<tree>/<n>`; both read)
  metadata.json                        format/version, each tree's structure,
                                       the user metadata (step, rng seed,
                                       history, ...), the arrays file's name,
                                       size and sha256, and a sha256 of the
                                       JSON document itself

Writes are atomic and crash-safe: the arrays file is written under a temporary
name, fsynced and renamed to a name derived from its content; then
`metadata.json` is replaced the same way and the directory fsynced. The
metadata is the commit point: until it is replaced, the previous metadata
still names the previous (untouched) arrays file, so overwriting a checkpoint
in place never leaves a mix. On load the checksums are verified, so a
truncated or bit-flipped file raises `CheckpointCorruptedError`.

Trees are nested tuples/lists/dicts (str keys)/namedtuples whose leaves may be
numpy or jax arrays (any dtype incl. bfloat16 and other ml_dtypes), numpy
scalars, Python scalars, strings, None, jax PRNG keys and ShapeDtype records.
`()` entries and the weight-cache markers round-trip as they are. Arrays come
back as numpy arrays; namedtuples come back as namedtuples of the same name
and fields (to recover the exact classes, e.g. optax states, use
`tree.unflatten_like(tree_leaves(loaded), template)`).

    save_native('run/ckpt_000000100', {'weights': w, 'state': s, 'slots': m},
                {'step': 100, 'history': {...}})
    ckpt = load_native('run/ckpt_000000100')  # ckpt.trees, ckpt.metadata
"""

import base64
import collections
import contextlib
import hashlib
import json
import os
import re
import typing

import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy as st_numpy

from retrax.checkpoints import limits
from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints.atomic import fsync_dir
from retrax.checkpoints.atomic import set_default_permissions
from retrax.checkpoints.atomic import temp_file
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import malformed_is_format_error
from retrax.checkpoints.records import convert_shape_dtypes
from retrax.checkpoints.records import is_shape_dtype
from retrax.checkpoints.records import TraxShapeDtype
from retrax.checkpoints.safe_unpickle import check_dtype
from retrax.errors import read_json

FORMAT_NAME = 'retrax-native'
FORMAT_VERSION = 1
METADATA_FILE = 'metadata.json'
_ARRAYS_FILE_RE = re.compile(r'^arrays\.[0-9a-f]{16}\.safetensors$')
_DTYPE_STR_RE = re.compile(r'^[<>|=]?[a-zA-Z]\d*(\[[a-zA-Z0-9]+\])?$')
# Dtypes that safetensors' numpy API stores natively; others go as raw bytes.
_SAFETENSORS_DTYPES = frozenset(np.dtype(t) for t in (
    np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32,
    np.uint32, np.int16, np.uint16, np.int8, np.uint8, np.bool_,
    np.complex64))
_HASH_CHUNK = 1 << 20


class NativeCheckpoint(typing.NamedTuple):
  """A loaded native checkpoint: `trees` (name -> tree) and user `metadata`."""
  trees: dict
  metadata: dict


# --- encoding -----------------------------------------------------------------


def _dtype_name(dtype):
  ml = ml_dtypes
  if getattr(ml, dtype.type.__name__, None) is dtype.type:
    return dtype.type.__name__
  return dtype.str


def _dtype_from_name(name, where):
  ml = ml_dtypes
  try:
    if isinstance(name, str) and re.fullmatch(r'[a-z0-9_]+', name) and hasattr(
        ml, name):
      return check_dtype(np.dtype(getattr(ml, name)))
    if isinstance(name, str) and _DTYPE_STR_RE.match(name):
      return check_dtype(np.dtype(name))
  except (TypeError, CheckpointError):
    pass
  raise CheckpointFormatError(f'{where}: unsupported dtype {name!r}.')


def _is_prng_key(x):
  if not type(x).__module__.startswith('jax'):
    return False
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _path_str(path):
  return ''.join(f'[{p!r}]' for p in path)


class _Encoder:
  """Turns trees into JSON nodes, collecting array leaves for safetensors."""

  def __init__(self):
    self.arrays = {}

  def encode(self, tree, name):
    self._name = name
    return self._node(tree, ())

  def _key(self, path):
    """`<tree>/<path>`, e.g. `weights/1/0/2` (sublayer 1, its sublayer 0,
    weight 2); made unique with `#n` if dict keys holding '/' collide."""
    key = '/'.join([self._name, *map(str, path)])
    base, n = key, 1
    while key in self.arrays:
      key, n = f'{base}#{n}', n + 1
    return key

  def _array_node(self, x, path, kind='array'):
    arr = np.asarray(x)
    try:
      check_dtype(arr.dtype)
    except CheckpointError:
      raise TypeError(
          f'{self._name}{_path_str(path)}: dtype {arr.dtype} cannot be saved '
          f'(object and structured dtypes are not supported).') from None
    if arr.dtype.byteorder == '>':
      arr = arr.astype(arr.dtype.newbyteorder('<'))
    key = self._key(path)
    node = {'t': kind, 'key': key, 'dtype': _dtype_name(arr.dtype),
            'shape': list(arr.shape)}
    if arr.dtype in _SAFETENSORS_DTYPES:
      stored = arr if arr.flags.c_contiguous else arr.copy(order='C')
    else:
      stored = np.frombuffer(arr.tobytes(order='C'), dtype=np.uint8)
      node['raw'] = True
    self.arrays[key] = stored
    return node

  def _node(self, x, path):
    if x is None:
      return {'t': 'none'}
    if isinstance(x, bool):
      return {'t': 'bool', 'v': x}
    if isinstance(x, int) and type(x) is int:
      return {'t': 'int', 'v': x}
    if type(x) is float:
      return {'t': 'float', 'v': x.hex()}
    if isinstance(x, str):
      return {'t': 'str', 'v': x}
    if isinstance(x, bytes):
      return {'t': 'bytes', 'v': base64.b64encode(x).decode('ascii')}
    if isinstance(x, np.ndarray):
      return self._array_node(x, path)
    if isinstance(x, np.generic):
      return self._array_node(x, path, kind='scalar')
    if is_shape_dtype(x):
      return {'t': 'shape_dtype', 'dtype': _dtype_name(np.dtype(x.dtype)),
              'shape': [None if d is None else int(d) for d in x.shape]}
    if isinstance(x, tuple) and hasattr(type(x), '_fields'):
      return {'t': 'namedtuple', 'name': type(x).__name__,
              'fields': list(type(x)._fields),
              'items': [self._node(c, path + (f,))
                        for f, c in zip(type(x)._fields, x)]}
    if isinstance(x, (tuple, list)):
      return {'t': 'tuple' if isinstance(x, tuple) else 'list',
              'items': [self._node(c, path + (i,)) for i, c in enumerate(x)]}
    if isinstance(x, dict):
      for k in x:
        if not isinstance(k, str):
          raise TypeError(
              f'{self._name}{_path_str(path)}: dict keys must be str; got '
              f'{k!r}.')
      return {'t': 'dict', 'keys': list(x),
              'items': [self._node(c, path + (k,)) for k, c in x.items()]}
    if hasattr(x, '__array__') and hasattr(x, 'dtype'):
      if _is_prng_key(x):
        return {'t': 'prng_key', 'impl': str(jax.random.key_impl(x)),
                'data': self._array_node(jax.random.key_data(x), path)}
      return self._array_node(x, path)
    raise TypeError(
        f'{self._name}{_path_str(path)}: cannot save a '
        f'{type(x).__module__}.{type(x).__qualname__}; supported leaves are '
        f'arrays, numbers, strings, bytes, None, PRNG keys and ShapeDtype.')


def _jsonable(x, path):
  """User metadata as plain JSON values (tuples become lists)."""
  if x is None or isinstance(x, (bool, str)):
    return x
  if isinstance(x, (int, float)):
    return x
  if isinstance(x, (np.generic, np.ndarray)) and np.ndim(x) == 0:
    return x.item()
  if isinstance(x, (list, tuple)):
    return [_jsonable(y, f'{path}[{i}]') for i, y in enumerate(x)]
  if isinstance(x, dict):
    out = {}
    for k, v in x.items():
      if not isinstance(k, str):
        raise TypeError(f'{path}: metadata keys must be str; got {k!r}.')
      out[k] = _jsonable(v, f'{path}[{k!r}]')
    return out
  raise TypeError(
      f'{path}: metadata must be JSON-able (dicts, lists, numbers, strings); '
      f'got {type(x).__name__}. Put arrays in a tree instead.')


def _canonical(doc):
  # Key order is kept (JSON parsing preserves it), so dict order round-trips.
  return json.dumps(doc, separators=(',', ':')).encode('utf-8')


def _file_sha256(path):
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(_HASH_CHUNK), b''):
      h.update(chunk)
  return h.hexdigest()


def _save_file(arrays, tmp, path):
  """safetensors' `save_file`, whose I/O errors (a full disk) become the
  `OSError`s they are, naming checkpoint `path`."""
  try:
    st_numpy.save_file(arrays, tmp)
  except safetensors.SafetensorError as e:
    m = re.search(r'os error (\d+)', str(e))
    if m is None:
      raise
    code = int(m.group(1))
    raise OSError(code, os.strerror(code), path) from None


def _write_arrays_file(path, arrays):
  """Writes `arrays` into checkpoint directory `path` under a name derived
  from their sha256 (fsynced, renamed into place); `(name, sha256, size)`."""
  with temp_file(path, '.arrays.', path) as (fd, tmp):
    os.close(fd)
    _save_file(arrays, tmp, path)
    with open(tmp, 'rb+') as f:
      set_default_permissions(f.fileno())
      os.fsync(f.fileno())
    digest = _file_sha256(tmp)
    size = os.path.getsize(tmp)
    arrays_file = f'arrays.{digest[:16]}.safetensors'
    os.replace(tmp, os.path.join(path, arrays_file))
  fsync_dir(path)
  return arrays_file, digest, size


def _write_files(path, arrays, nodes, user_metadata):
  """The arrays file, then `metadata.json` (the commit point); then the old
  arrays file, no longer referenced, goes."""
  arrays_file, digest, size = _write_arrays_file(path, arrays)
  doc = {'format': FORMAT_NAME, 'version': FORMAT_VERSION,
         'arrays_file': arrays_file, 'arrays_sha256': digest,
         'arrays_size': size, 'trees': nodes, 'metadata': user_metadata}
  doc['checksum'] = hashlib.sha256(_canonical(doc)).hexdigest()
  with atomic_write(os.path.join(path, METADATA_FILE)) as f:
    f.write(json.dumps(doc, indent=1).encode('utf-8'))
  for name in os.listdir(path):
    if _ARRAYS_FILE_RE.match(name) and name != arrays_file:
      with contextlib.suppress(OSError):
        os.remove(os.path.join(path, name))


def _discard(path):
  """Removes a checkpoint directory this save created and could not finish
  (everything in it is the save's own)."""
  with contextlib.suppress(OSError):
    for name in os.listdir(path):
      os.remove(os.path.join(path, name))
    os.rmdir(path)


def save_native(path, trees, metadata=None):
  """Saves named trees of arrays plus JSON metadata as a checkpoint directory.

  Args:
    path: the checkpoint directory (created if missing; an existing checkpoint
      there is replaced atomically).
    trees: dict from a name (str without '/') to a tree, e.g. `{'weights': w,
      'state': s, 'slots': opt_state, 'rng': key}`.
    metadata: JSON-able dict (step, history, config ...); numpy scalars are
      converted to Python numbers, tuples to lists.

  Returns:
    `path`.

  Raises:
    TypeError: a leaf or metadata value that the format cannot hold; the
      message names its path.
    OSError: the disk is full, read-only, ... (naming the file or `path`);
      the previous checkpoint at `path` is intact, a new directory removed.
  """
  path = os.fspath(path)
  if not isinstance(trees, dict):
    raise TypeError(f'trees must be a dict of named trees; got '
                    f'{type(trees).__name__}.')
  bad = [k for k in trees if not (isinstance(k, str) and k and '/' not in k)]
  if bad:
    raise TypeError(f'tree names must be non-empty str without "/"; got '
                    f'{bad!r}.')
  encoder = _Encoder()
  nodes = {name: encoder.encode(tree, name) for name, tree in trees.items()}
  user_metadata = _jsonable(dict(metadata or {}), 'metadata')

  created = not os.path.isdir(path)
  os.makedirs(path, exist_ok=True)
  try:
    if created:
      fsync_dir(os.path.dirname(os.path.abspath(path)))
    _write_files(path, encoder.arrays, nodes, user_metadata)
  except BaseException:
    if created:  # A full disk leaves no empty checkpoint directory behind.
      _discard(path)
    raise
  return path


# --- decoding -----------------------------------------------------------------


def is_native_checkpoint(path):
  """True if `path` is a directory holding a native checkpoint's metadata."""
  return os.path.isdir(path) and os.path.isfile(
      os.path.join(path, METADATA_FILE))


def _read_metadata_doc(path):
  """The checksum-verified metadata document of a native checkpoint."""
  path = os.fspath(path)
  meta_path = os.path.join(path, METADATA_FILE)
  if not os.path.isfile(meta_path):
    raise CheckpointCorruptedError(
        f'{path}: no {METADATA_FILE}; not a native checkpoint, or its save '
        f'did not complete.')
  limit = limits.max_bytes()
  if os.path.getsize(meta_path) > limit:
    raise limits.too_big(meta_path, 'the file', limit)
  doc = read_json(meta_path, CheckpointCorruptedError,
                  'the file is truncated or corrupted.')
  if not isinstance(doc, dict) or doc.get('format') != FORMAT_NAME:
    raise CheckpointFormatError(f'{meta_path}: not a {FORMAT_NAME} checkpoint.')
  if doc.get('version') != FORMAT_VERSION:
    raise CheckpointFormatError(
        f'{meta_path}: format version {doc.get("version")!r}; this retrax '
        f'reads version {FORMAT_VERSION}.')
  body = {k: v for k, v in doc.items() if k != 'checksum'}
  if hashlib.sha256(_canonical(body)).hexdigest() != doc.get('checksum'):
    raise CheckpointCorruptedError(
        f'{meta_path}: metadata checksum mismatch; the file is corrupted.')
  if not isinstance(doc.get('metadata', {}), dict):
    raise CheckpointFormatError(f'{meta_path}: its metadata is not a dict.')
  return doc


def read_metadata(path):
  """A native checkpoint's user metadata, its own checksum verified (the
  arrays file is not read: use `verify_native` for that)."""
  return _read_metadata_doc(path)['metadata']


def _read_verified(path):
  """Returns (metadata document, arrays file bytes), both checksum-verified."""
  path = os.fspath(path)
  doc = _read_metadata_doc(path)
  meta_path = os.path.join(path, METADATA_FILE)
  limit = limits.max_bytes()
  arrays_file = doc.get('arrays_file')
  if not isinstance(arrays_file, str) or not _ARRAYS_FILE_RE.match(arrays_file):
    raise CheckpointFormatError(f'{meta_path}: bad arrays_file {arrays_file!r}.')
  arrays_path = os.path.join(path, arrays_file)
  if os.path.isfile(arrays_path) and os.path.getsize(arrays_path) > limit:
    raise limits.too_big(arrays_path, 'the file', limit)
  try:
    with open(arrays_path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    raise CheckpointCorruptedError(
        f'{arrays_path}: missing; the checkpoint is incomplete.') from None
  if len(data) != doc.get('arrays_size'):
    raise CheckpointCorruptedError(
        f'{arrays_path}: {len(data)} bytes but the metadata records '
        f'{doc.get("arrays_size")}; the file is truncated or corrupted.')
  if hashlib.sha256(data).hexdigest() != doc.get('arrays_sha256'):
    raise CheckpointCorruptedError(
        f'{arrays_path}: sha256 mismatch; the array data is corrupted.')
  return doc, data


def verify_native(path):
  """Checks a native checkpoint's files and checksums; returns its user metadata.

  Raises:
    CheckpointCorruptedError: missing, truncated or altered files.
    CheckpointFormatError: not a native checkpoint of a supported version.
  """
  doc, _ = _read_verified(path)
  return doc['metadata']


_NAMEDTUPLE_TYPES = {}


def _namedtuple_type(name, fields, where):
  key = (name, tuple(fields))
  if key not in _NAMEDTUPLE_TYPES:
    try:
      _NAMEDTUPLE_TYPES[key] = collections.namedtuple(name, fields)
    except (TypeError, ValueError) as e:
      raise CheckpointFormatError(f'{where}: bad namedtuple ({e}).') from None
  return _NAMEDTUPLE_TYPES[key]


class _Decoder:
  """Rebuilds trees from JSON nodes and the loaded safetensors arrays."""

  def __init__(self, arrays, shape_dtype_factory):
    self._arrays = arrays
    self._factory = shape_dtype_factory

  def _array(self, node, where):
    dtype = _dtype_from_name(node.get('dtype'), where)
    shape = node.get('shape')
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and d >= 0 for d in shape):
      raise CheckpointFormatError(f'{where}: bad shape {shape!r}.')
    stored = self._arrays.get(node.get('key'))
    if stored is None:
      raise CheckpointFormatError(
          f'{where}: array {node.get("key")!r} missing from the arrays file.')
    if node.get('raw'):
      if stored.nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise CheckpointFormatError(f'{where}: raw array has the wrong size.')
      return np.frombuffer(stored.tobytes(), dtype=dtype).reshape(shape)
    if stored.dtype != dtype or list(stored.shape) != shape:
      raise CheckpointFormatError(
          f'{where}: stored {stored.dtype}{list(stored.shape)} does not match '
          f'the recorded {dtype}{shape}.')
    return np.array(stored)  # A writable copy, detached from the file buffer.

  def node(self, node, where):
    if not isinstance(node, dict):
      raise CheckpointFormatError(f'{where}: malformed tree node.')
    t = node.get('t')
    if t == 'none':
      return None
    if t in ('bool', 'int', 'str'):
      value = node.get('v')
      want = {'bool': bool, 'int': int, 'str': str}[t]
      if not isinstance(value, want):
        raise CheckpointFormatError(f'{where}: bad {t} value {value!r}.')
      return value
    if t == 'float':
      try:
        return float.fromhex(node.get('v'))
      except (TypeError, ValueError):
        raise CheckpointFormatError(f'{where}: bad float.') from None
    if t == 'bytes':
      try:
        return base64.b64decode(node.get('v', ''), validate=True)
      except (TypeError, ValueError):  # binascii.Error is a ValueError.
        raise CheckpointFormatError(f'{where}: bad base64 bytes.') from None
    if t == 'array':
      return self._array(node, where)
    if t == 'scalar':
      return self._array(node, where)[()]
    if t == 'prng_key':
      data = self._array(node.get('data', {}), where)
      return jax.random.wrap_key_data(data, impl=str(node.get('impl')))
    if t == 'shape_dtype':
      return self._factory(
          tuple(node.get('shape', ())), _dtype_from_name(node.get('dtype'),
                                                         where))
    items = node.get('items')
    if not isinstance(items, list):
      raise CheckpointFormatError(f'{where}: node {t!r} has no items.')
    if t == 'tuple':
      return tuple(self.node(c, f'{where}[{i}]') for i, c in enumerate(items))
    if t == 'list':
      return [self.node(c, f'{where}[{i}]') for i, c in enumerate(items)]
    if t == 'namedtuple':
      cls = _namedtuple_type(node.get('name'), node.get('fields'), where)
      return cls(*(self.node(c, f'{where}[{i}]') for i, c in enumerate(items)))
    if t == 'dict':
      keys = node.get('keys')
      if not isinstance(keys, list) or len(keys) != len(items):
        raise CheckpointFormatError(f'{where}: dict keys do not match items.')
      if not all(isinstance(k, str) for k in keys):
        raise CheckpointFormatError(f'{where}: dict keys must be strings.')
      return {k: self.node(c, f'{where}[{k!r}]') for k, c in zip(keys, items)}
    raise CheckpointFormatError(f'{where}: unknown node type {t!r}.')


def load_native(path, shape_dtype_factory=None):
  """Loads a checkpoint written by `save_native`, verifying its checksums.

  Args:
    path: the checkpoint directory.
    shape_dtype_factory: `(shape, dtype) -> record` for ShapeDtype leaves;
      `retrax.shapes.ShapeDtype` by default.

  Returns:
    `NativeCheckpoint(trees, metadata)`.

  Raises:
    CheckpointCorruptedError: truncated/altered files (checked before any
      array is decoded).
    CheckpointFormatError: not a native checkpoint of a supported version.
  """
  doc, data = _read_verified(path)
  try:
    arrays = st_numpy.load(data)
  except (safetensors.SafetensorError, ValueError, KeyError) as e:
    raise CheckpointCorruptedError(
        f'{path}: unreadable arrays file ({e}).') from None
  if shape_dtype_factory is None:
    def shape_dtype_factory(shape, dtype):
      return convert_shape_dtypes(TraxShapeDtype(shape, dtype))
  decoder = _Decoder(arrays, shape_dtype_factory)
  nodes = doc.get('trees')
  if not isinstance(nodes, dict):
    raise CheckpointFormatError(f'{path}: metadata has no trees.')
  with malformed_is_format_error(os.path.join(path, METADATA_FILE)):
    trees = {name: decoder.node(node, f'{path}: {name}')
             for name, node in nodes.items()}
  return NativeCheckpoint(trees=trees, metadata=doc.get('metadata', {}))
