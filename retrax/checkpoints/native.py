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

A run whose arrays are split over the devices of several processes (FSDP over
processes) writes a sharded checkpoint (format version 2) with
`save_native_sharded`, gathering no array on any host: each process writes
the pieces it holds of each split array (one copy of each) to its own

  shards_<i>_of_<n>.<token>.safetensors   pieces keyed `<key>[a:b,c:d]` (their
                                          slices of the whole array)

with a small `shards_<i>_of_<n>.<token>.json` naming the file, its sha256
and each piece's slices (`token`: 16 hex digits drawn for the save, the same
on every process). After a barrier, process 0 writes the arrays file (every
array not split), then `metadata.json` holding the pieces tables and each
shards file's size and sha256: the commit point, as above; the `.json`
tables, now inside it, go. A kill before that leaves the previous metadata
(or none) and files no metadata names, which loading ignores and rotation
removes. Loading verifies every file's checksum and assembles each split
array whole from its pieces (which must cover it), so a sharded checkpoint
loads like any other, on any number of processes and devices.

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
import math
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
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

FORMAT_NAME = 'retrax-native'
FORMAT_VERSION = 1
# Written only by `save_native_sharded`: version 1 readers refuse it cleanly.
SHARDED_FORMAT_VERSION = 2
METADATA_FILE = 'metadata.json'
_ARRAYS_FILE_RE = re.compile(r'^arrays\.[0-9a-f]{16}\.safetensors$')
# A process's pieces and their table: `shards_<i>_of_<n>.<token>.<ext>`.
SHARDS_FILE_PATTERN = r'shards_\d{5}_of_\d{5}\.[0-9a-f]{16}\.(?:safetensors|json)'
_SHARDS_FILE_RE = re.compile(f'^{SHARDS_FILE_PATTERN}$')
_TOKEN_RE = re.compile(r'^[0-9a-f]{16}$')
_DTYPE_STR_RE = re.compile(r'^[<>|=]?[a-zA-Z]\d*(\[[a-zA-Z0-9]+\])?$')
# Dtypes that safetensors' numpy API stores natively; others go as raw bytes.
_SAFETENSORS_DTYPES = frozenset(np.dtype(t) for t in (
    np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32,
    np.uint32, np.int16, np.uint16, np.int8, np.uint8, np.bool_,
    np.complex64))
_HASH_CHUNK = 1 << 20


class Shards:
  """The pieces of an array split over processes that this process holds.

  A leaf for `save_native_sharded`. Attributes: `shape` and `dtype` of the
  whole array; `pieces`, `[(index, array), ...]` with `index` a tuple of
  slices (one per axis, as `jax.Array.addressable_shards[k].index`) and
  `array` the part of the whole it selects.
  """

  def __init__(self, shape, dtype, pieces):
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)
    self.pieces = list(pieces)


class NativeCheckpoint(typing.NamedTuple):
  """A loaded native checkpoint: `trees` (name -> tree) and user `metadata`."""
  trees: dict
  metadata: dict


# --- encoding -----------------------------------------------------------------


def _dtype_name(dtype):
  ml = ml_dtypes
  name = dtype.type.__name__
  if getattr(ml, name, None) is dtype.type:
    return name
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
    self.pieces = {}  # This process's pieces of split arrays, by entry name.
    self.piece_table = []  # [{'key', 'entry', 'index'}, ...] of `pieces`.
    self.split_keys = set()  # Keys of the split arrays (`Shards` leaves).

  def encode(self, tree, name):
    self._name = name
    return self._node(tree, ())

  def _key(self, path):
    """`<tree>/<path>`, e.g. `weights/1/0/2` (sublayer 1, its sublayer 0,
    weight 2); made unique with `#n` if dict keys holding '/' collide."""
    key = '/'.join([self._name, *map(str, path)])
    base, n = key, 1
    while key in self.arrays or key in self.split_keys:
      key, n = f'{base}#{n}', n + 1
    return key

  def _split_node(self, x, path):
    """A `Shards` leaf: the node of the whole array; its pieces go to
    `pieces` (the process's shards file), none to `arrays`."""
    dtype = x.dtype.newbyteorder('<') if x.dtype.byteorder == '>' else x.dtype
    try:
      check_dtype(dtype)
    except CheckpointError:
      raise ArgumentTypeError(f'{self._name}{_path_str(path)}: dtype {dtype} cannot '
                              'be saved.') from None
    key = self._key(path)
    self.split_keys.add(key)
    node = {'t': 'array', 'key': key, 'dtype': _dtype_name(dtype),
            'shape': list(x.shape), 'split': True}
    raw = dtype not in _SAFETENSORS_DTYPES
    if raw:
      node['raw'] = True
    for index, piece in x.pieces:
      bounds = _bounds(index, x.shape, f'{self._name}{_path_str(path)}')
      arr = np.asarray(piece).astype(dtype, copy=False)
      if arr.shape != tuple(b - a for a, b in bounds):
        raise ArgumentValueError(f'{self._name}{_path_str(path)}: a piece of shape '
                                 f'{arr.shape} for the slices {bounds}.')
      entry = key + '[' + ','.join(f'{a}:{b}' for a, b in bounds) + ']'
      self.pieces[entry] = (np.frombuffer(arr.tobytes(order='C'), np.uint8)
                            if raw else np.ascontiguousarray(arr))
      self.piece_table.append({'key': key, 'entry': entry, 'index': bounds})
    return node

  def _array_node(self, x, path, kind='array'):
    arr = np.asarray(x)
    try:
      check_dtype(arr.dtype)
    except CheckpointError:
      raise ArgumentTypeError(
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
    if isinstance(x, Shards):
      return self._split_node(x, path)
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
      cls: typing.Any = type(x)  # A namedtuple class.
      return {'t': 'namedtuple', 'name': cls.__name__,
              'fields': list(cls._fields),
              'items': [self._node(c, path + (f,))
                        for f, c in zip(cls._fields, x)]}
    if isinstance(x, (tuple, list)):
      return {'t': 'tuple' if isinstance(x, tuple) else 'list',
              'items': [self._node(c, path + (i,)) for i, c in enumerate(x)]}
    if isinstance(x, dict):
      for k in x:
        if not isinstance(k, str):
          raise ArgumentTypeError(
              f'{self._name}{_path_str(path)}: dict keys must be str; got '
              f'{k!r}.')
      return {'t': 'dict', 'keys': list(x),
              'items': [self._node(c, path + (k,)) for k, c in x.items()]}
    if hasattr(x, '__array__') and hasattr(x, 'dtype'):
      if _is_prng_key(x):
        return {'t': 'prng_key', 'impl': str(jax.random.key_impl(x)),
                'data': self._array_node(jax.random.key_data(x), path)}
      return self._array_node(x, path)
    raise ArgumentTypeError(
        f'{self._name}{_path_str(path)}: cannot save a '
        f'{type(x).__module__}.{type(x).__qualname__}; supported leaves are '
        f'arrays, numbers, strings, bytes, None, PRNG keys and ShapeDtype.')


def _bounds(index, shape, where):
  """`[[start, stop], ...]` of `index` (slices of step 1, one per axis; axes
  left out are whole)."""
  index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
  if len(index) != len(shape):
    raise ArgumentValueError(f'{where}: index {index} for shape {shape}.')
  bounds = []
  for s, dim in zip(index, shape):
    start, stop, step = s.indices(dim)
    if step != 1:
      raise ArgumentValueError(f'{where}: a piece with a strided index {index}.')
    bounds.append([start, max(start, stop)])
  return bounds


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
        raise ArgumentTypeError(f'{path}: metadata keys must be str; got {k!r}.')
      out[k] = _jsonable(v, f'{path}[{k!r}]')
    return out
  raise ArgumentTypeError(
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


def _write_safetensors(path, arrays, prefix, name_of):
  """Writes `arrays` into checkpoint directory `path` as `name_of(sha256)`
  (under a temporary name `<prefix>...tmp`, fsynced, renamed into place);
  `(name, sha256, size)`."""
  with temp_file(path, prefix, path) as (fd, tmp):
    os.close(fd)
    _save_file(arrays, tmp, path)
    with open(tmp, 'rb+') as f:
      set_default_permissions(f.fileno())
      os.fsync(f.fileno())
    digest = _file_sha256(tmp)
    size = os.path.getsize(tmp)
    name = name_of(digest)
    os.replace(tmp, os.path.join(path, name))
  fsync_dir(path)
  return name, digest, size


def _write_arrays_file(path, arrays):
  """Writes `arrays` into checkpoint directory `path` under a name derived
  from their sha256 (fsynced, renamed into place); `(name, sha256, size)`."""
  return _write_safetensors(path, arrays, '.arrays.',
                            lambda digest: f'arrays.{digest[:16]}.safetensors')


def _write_files(path, arrays, nodes, user_metadata, shard_files=None):
  """The arrays file, then `metadata.json` (the commit point); then the old
  arrays file and shards files, no longer referenced, go (and the shards
  tables, now in the metadata)."""
  arrays_file, digest, size = _write_arrays_file(path, arrays)
  doc = {'format': FORMAT_NAME, 'version': FORMAT_VERSION,
         'arrays_file': arrays_file, 'arrays_sha256': digest,
         'arrays_size': size}
  if shard_files is not None:
    doc['version'] = SHARDED_FORMAT_VERSION
    doc['shard_files'] = shard_files
  doc.update(trees=nodes, metadata=user_metadata)
  doc['checksum'] = hashlib.sha256(_canonical(doc)).hexdigest()
  with atomic_write(os.path.join(path, METADATA_FILE)) as f:
    f.write(json.dumps(doc, indent=1).encode('utf-8'))
  keep = {arrays_file, *(f['file'] for f in shard_files or ())}
  for name in os.listdir(path):
    if (_ARRAYS_FILE_RE.match(name) or _SHARDS_FILE_RE.match(name)) and (
        name not in keep):
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
  encoder, nodes, user_metadata = _encode(trees, metadata)
  if encoder.split_keys:
    raise ArgumentTypeError('Shards leaves (arrays split over processes) are saved '
                            'with save_native_sharded.')

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


def _encode(trees, metadata):
  """`(encoder, nodes, user metadata)` of `save_native`'s arguments."""
  if not isinstance(trees, dict):
    raise ArgumentTypeError(f'trees must be a dict of named trees; got '
                            f'{type(trees).__name__}.')
  bad = [k for k in trees if not (isinstance(k, str) and k and '/' not in k)]
  if bad:
    raise ArgumentTypeError(f'tree names must be non-empty str without "/"; got '
                            f'{bad!r}.')
  encoder = _Encoder()
  nodes = {name: encoder.encode(tree, name) for name, tree in trees.items()}
  return encoder, nodes, _jsonable(dict(metadata or {}), 'metadata')


def _shards_name(token, process_index, process_count, ext):
  return (f'shards_{process_index:05d}_of_{process_count:05d}.{token}.'
          f'{ext}')


def write_process_shards(path, encoder, token, process_index, process_count):
  """Writes this process's pieces (`encoder.pieces`) into checkpoint
  directory `path`: the shards file, then its table (`.json`, atomically)."""
  name, digest, size = _write_safetensors(
      path, encoder.pieces, '.shards.',
      lambda _: _shards_name(token, process_index, process_count,
                             'safetensors'))
  table = {'file': name, 'sha256': digest, 'size': size,
           'process': process_index, 'pieces': encoder.piece_table}
  with atomic_write(os.path.join(path, _shards_name(
      token, process_index, process_count, 'json'))) as f:
    f.write(json.dumps(table).encode('utf-8'))


def _read_table(path, token, process_index, process_count):
  """The table process `process_index` wrote for this save."""
  table_path = os.path.join(path, _shards_name(token, process_index,
                                               process_count, 'json'))
  table = read_json(table_path, CheckpointCorruptedError,
                    'the file is truncated or corrupted.')
  if not isinstance(table, dict) or table.get('process') != process_index:
    raise CheckpointFormatError(f'{table_path}: not a shards table.')
  return table


def save_native_sharded(path, trees, metadata=None, *, process_index,
                        process_count, token, all_ok):
  """`save_native` of trees whose split arrays are `Shards`, called by every
  process at the same point (see the module docstring).

  Args:
    path: the checkpoint directory, the same on every process (a shared
      file system).
    trees, metadata: as `save_native`'s; leaves that are not `Shards` must
      be the same on every process (process 0 writes them).
    process_index, process_count: this process and how many there are.
    token: 16 hex digits, the same on every process and new for each save
      (it names this save's shards files).
    all_ok: `all_ok(ok) -> [ok of each process]`: a barrier that every
      process calls once, after writing its shards.

  Returns:
    `path`.

  Raises:
    OSError, TypeError: this process could not write its shards.
    CheckpointError: another process could not; nothing was committed (a
      previous checkpoint at `path` is intact).
  """
  path = os.fspath(path)
  if not isinstance(token, str) or not _TOKEN_RE.match(token):
    raise ArgumentValueError(f'token must be 16 hex digits; got {token!r}.')
  error = None
  try:
    encoder, nodes, user_metadata = _encode(trees, metadata)
    os.makedirs(path, exist_ok=True)
    write_process_shards(path, encoder, token, process_index, process_count)
  except Exception as e:  # pylint: disable=broad-except
    error = e  # Raised after the barrier, which the others wait at.
  oks = all_ok(error is None)
  if error is not None:
    raise error
  failed = [i for i, ok in enumerate(oks) if not ok]
  if failed:
    raise CheckpointError(
        f'{path}: process(es) {", ".join(map(str, failed))} could not write '
        'their shards, so the checkpoint was not committed.')
  if process_index == 0:
    shard_files = [_read_table(path, token, i, process_count)
                   for i in range(process_count)]
    _write_files(path, encoder.arrays, nodes, user_metadata, shard_files)
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
  if doc.get('version') not in (FORMAT_VERSION, SHARDED_FORMAT_VERSION):
    raise CheckpointFormatError(
        f'{meta_path}: format version {doc.get("version")!r}; this retrax '
        f'reads versions {FORMAT_VERSION} and {SHARDED_FORMAT_VERSION}.')
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


def _read_checked(path, name, size, sha256):
  """The bytes of file `name` of checkpoint `path`, of the recorded `size`
  and `sha256`."""
  file_path = os.path.join(path, name)
  limit = limits.max_bytes()
  if os.path.isfile(file_path) and os.path.getsize(file_path) > limit:
    raise limits.too_big(file_path, 'the file', limit)
  try:
    with open(file_path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    raise CheckpointCorruptedError(
        f'{file_path}: missing; the checkpoint is incomplete.') from None
  if len(data) != size:
    raise CheckpointCorruptedError(
        f'{file_path}: {len(data)} bytes but the metadata records '
        f'{size}; the file is truncated or corrupted.')
  if hashlib.sha256(data).hexdigest() != sha256:
    raise CheckpointCorruptedError(
        f'{file_path}: sha256 mismatch; the array data is corrupted.')
  return data


def _read_verified(path):
  """Returns (metadata document, arrays file bytes, [(shards table, shards
  file bytes), ...]), all checksum-verified."""
  path = os.fspath(path)
  doc = _read_metadata_doc(path)
  meta_path = os.path.join(path, METADATA_FILE)
  arrays_file = doc.get('arrays_file')
  if not isinstance(arrays_file, str) or not _ARRAYS_FILE_RE.match(arrays_file):
    raise CheckpointFormatError(f'{meta_path}: bad arrays_file {arrays_file!r}.')
  data = _read_checked(path, arrays_file, doc.get('arrays_size'),
                       doc.get('arrays_sha256'))
  shards = []
  tables = doc.get('shard_files', [])
  if not isinstance(tables, list):
    raise CheckpointFormatError(f'{meta_path}: bad shard_files.')
  for table in tables:
    name = table.get('file') if isinstance(table, dict) else None
    if not isinstance(name, str) or not _SHARDS_FILE_RE.match(name) or (
        not name.endswith('.safetensors')):
      raise CheckpointFormatError(f'{meta_path}: bad shards file {name!r}.')
    shards.append((table, _read_checked(path, name, table.get('size'),
                                        table.get('sha256'))))
  return doc, data, shards


def verify_native(path):
  """Checks a native checkpoint's files and checksums; returns its user metadata.

  Raises:
    CheckpointCorruptedError: missing, truncated or altered files.
    CheckpointFormatError: not a native checkpoint of a supported version.
  """
  doc, _, _ = _read_verified(path)
  return doc['metadata']


_NAMEDTUPLE_TYPES: typing.Dict[typing.Tuple[str, tuple], type] = {}


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

  def __init__(self, arrays, shape_dtype_factory, pieces=None):
    self._arrays = arrays
    self._factory = shape_dtype_factory
    self._pieces = pieces or {}  # key -> [(bounds, stored), ...]

  def _array(self, node, where):
    dtype = _dtype_from_name(node.get('dtype'), where)
    shape = node.get('shape')
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and d >= 0 for d in shape):
      raise CheckpointFormatError(f'{where}: bad shape {shape!r}.')
    if node.get('split'):
      return self._assemble(node, dtype, shape, where)
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

  def _assemble(self, node, dtype, shape, where):
    """A split array, whole, from the pieces of every process's file.

    The pieces are checked against the recorded shape before the array is
    allocated (a crafted shape claims no more memory than the files hold),
    and must tile it: no slice overlaps another, none is missing.
    """
    pieces = []
    for bounds, stored in self._pieces.get(node.get('key'), ()):
      if not isinstance(bounds, list) or len(bounds) != len(shape) or not all(
          isinstance(b, list) and len(b) == 2 and
          all(isinstance(i, int) and not isinstance(i, bool) for i in b) and
          0 <= b[0] <= b[1] <= dim for b, dim in zip(bounds, shape)):
        raise CheckpointFormatError(f'{where}: bad piece slices {bounds!r}.')
      piece_shape = tuple(b - a for a, b in bounds)
      if node.get('raw'):
        if stored.nbytes != int(np.prod(piece_shape, dtype=np.int64)) * (
            dtype.itemsize):
          raise CheckpointFormatError(f'{where}: a raw piece has the wrong '
                                      'size.')
        piece = np.frombuffer(stored.tobytes(), dtype).reshape(piece_shape)
      elif stored.dtype != dtype or stored.shape != piece_shape:
        raise CheckpointFormatError(
            f'{where}: a stored piece {stored.dtype}{list(stored.shape)} for '
            f'the slices {bounds}.')
      else:
        piece = stored
      pieces.append((tuple(slice(a, b) for a, b in bounds), piece))
    # Python ints: a crafted shape's product does not wrap around.
    want = math.prod(shape)
    held = sum(p.size for _, p in pieces)
    if held != want:
      raise CheckpointFormatError(
          f'{where}: the shards files do not cover the whole array exactly: '
          f'they hold {held} values of its shape {shape} ({want}); pieces are '
          'missing or overlap, or the recorded shape is not the saved one.')
    out = np.zeros(shape, dtype)
    covered = np.zeros(shape, bool)
    for index, piece in pieces:
      if covered[index].any():
        raise CheckpointFormatError(
            f'{where}: two pieces of the shards files overlap at the slices '
            f'{[[s.start, s.stop] for s in index]}.')
      out[index] = piece
      covered[index] = True
    return out

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
      value = node.get('v')
      try:
        if isinstance(value, str):
          return float.fromhex(value)
      except ValueError:
        pass
      raise CheckpointFormatError(f'{where}: bad float.')
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


def _pieces(path, shards):
  """`{key: [(slices, stored array), ...]}` of the verified shards files."""
  pieces = collections.defaultdict(list)
  for table, data in shards:
    try:
      stored = st_numpy.load(data)
    except (safetensors.SafetensorError, ValueError, KeyError) as e:
      raise CheckpointCorruptedError(
          f'{path}: unreadable shards file {table["file"]} ({e}).') from None
    entries = table.get('pieces')
    if not isinstance(entries, list) or not all(
        isinstance(entry, dict) and entry.get('entry') in stored
        for entry in entries):
      raise CheckpointFormatError(
          f'{path}: the table of {table["file"]} does not match its pieces.')
    for entry in entries:
      pieces[entry.get('key')].append((entry.get('index'), stored[entry['entry']]))
  return pieces


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
  doc, data, shards = _read_verified(path)
  try:
    arrays = st_numpy.load(data)
  except (safetensors.SafetensorError, ValueError, KeyError) as e:
    raise CheckpointCorruptedError(
        f'{path}: unreadable arrays file ({e}).') from None
  if shape_dtype_factory is None:
    def shape_dtype_factory(shape, dtype):
      return convert_shape_dtypes(TraxShapeDtype(shape, dtype))
  decoder = _Decoder(arrays, shape_dtype_factory, _pieces(path, shards))
  nodes = doc.get('trees')
  if not isinstance(nodes, dict):
    raise CheckpointFormatError(f'{path}: metadata has no trees.')
  with malformed_is_format_error(os.path.join(path, METADATA_FILE)):
    trees = {name: decoder.node(node, f'{path}: {name}')
             for name, node in nodes.items()}
  return NativeCheckpoint(trees=trees, metadata=doc.get('metadata', {}))
