"""Reading and writing the checkpoint files of Trax 1.2–1.4.

Readers go through the restricted unpickler (no code from the file runs) and
return one normalized dict whatever the layout:

  `format`           'loop' | 'trainer' | 'layer' | 'legacy_pkl'
  `step`             int, or None for a `Layer.save_to_file` file
  `flat_weights`     list of numpy arrays, Trax's flat order
  `flat_state`       list (None where the file holds no state)
  `flat_eval_state`  list (the train state where the file has no eval state)
  `slots`            list (one per task) of flat lists of optimizer slots
  `history`          {mode: {metric: [(step, value), ...]}}, scalars as floats
  `input_signature`  tuple of ShapeDtype records, or None
  `opt_params`       dict (legacy Trainer only) or None
  `version_timestamp` str or None

Layouts:
  * `training.Loop.save_checkpoint`: `<base>.pkl.gz` with `flat_weights` an
    int (the gzip level) and the arrays in `<base>.weights.npy.gz` and
    `<base>.opt_slots{i}.npy.gz`; older Loops kept weights/slots inline.
  * legacy `Trainer.save_state`: one `.pkl.gz` with inline `flat_weights`,
    nested `slots`, `opt_params` and a `History` object.
  * `Layer.save_to_file`: one `.pkl.gz` with `flat_weights`, optionally
    `flat_state`, `input_signature`.
  * Trax 1.2.x `model.pkl`: a plain (not gzipped) pickle of nested `weights`,
    `state`, `slots`, `opt_params`, `history`.

bfloat16 arrays in `.npy.gz` files are stored as uint16 bits; they stay uint16
unless `restore_bfloat16=True` (or unflattening against a signature that says
bfloat16, see `tree.unflatten_like`).

Writers emit the Loop and Layer layouts so that Trax 1.4.1 reads them, with
pickles that reference only numpy/builtin/`trax.shapes.ShapeDtype` globals.
"""

import collections
import contextlib
import gzip
import os
import re
import secrets

import numpy as np

from retrax.checkpoints import limits
from retrax.checkpoints import npy_stream
from retrax.checkpoints import pickle_writer
from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints.atomic import fsync_dir
from retrax.checkpoints.atomic import naming
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import CheckpointNotFoundError
from retrax.checkpoints.errors import malformed_is_format_error
from retrax.checkpoints.records import TraxHistory
from retrax.checkpoints.records import convert_shape_dtypes
from retrax.checkpoints.records import is_shape_dtype
from retrax.checkpoints.safe_unpickle import safe_load
from retrax.checkpoints.safe_unpickle import safe_loads
from retrax.checkpoints.tree import tree_leaves
from retrax.validation import ArgumentTypeError

LOOP_VERSION_TIMESTAMP = 'Mar-10-2021'
_GZIP_MAGIC = b'\x1f\x8b'
_PICKLE_SUFFIX = '.pkl.gz'
_SIDECARS_KEY = 'retrax_sidecars'


def load_trax_pickle(path, max_bytes=None):
  """Restricted-unpickles a Trax `.pkl.gz` (or plain `.pkl`) file.

  Gzip is detected from the file's magic bytes, not its name. The whole gzip
  stream is decompressed first (at most `limits.max_bytes(max_bytes)` bytes),
  so its CRC and length are verified before anything is unpickled.
  """
  path = os.fspath(path)
  limit = limits.max_bytes(max_bytes)
  try:
    with open(path, 'rb') as f:
      gzipped = f.read(2) == _GZIP_MAGIC
      if not gzipped:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
          raise limits.too_big(path, f'the file ({size} bytes)', limit)
        f.seek(0)
        return _acyclic(safe_load(f), path)
  except FileNotFoundError:
    raise CheckpointNotFoundError(f'checkpoint not found: {path}') from None
  return _acyclic(safe_loads(limits.read_gzip(path, limit)), path)


def _acyclic(obj, path):
  """`obj`, if no container in it holds itself (a crafted pickle can build
  such cycles; every later walk over them would recurse forever)."""
  stack, on_path, done = [(obj, False)], set(), set()
  while stack:  # Depth first, without recursion; shared parts walked once.
    x, leaving = stack.pop()
    if leaving:
      on_path.discard(id(x))
      done.add(id(x))
      continue
    if not isinstance(x, (list, tuple, dict)) or id(x) in done:
      continue
    if id(x) in on_path:
      raise CheckpointFormatError(
          f'{path}: the pickle holds a container that contains itself; '
          'no checkpoint does.')
    on_path.add(id(x))
    stack.append((x, True))
    children = x.values() if isinstance(x, dict) else x
    stack.extend((c, False) for c in children)
  return obj


def _base_of(path):
  return path[:-len(_PICKLE_SUFFIX)] if path.endswith(_PICKLE_SUFFIX) else path


def _sidecar_weights_path(path):
  """Where Trax looks for the weights of a `flat_weights: int` pickle."""
  if path.endswith(_PICKLE_SUFFIX):
    candidate = _base_of(path) + '.weights.npy.gz'
    if os.path.exists(candidate) or not os.path.exists(path + '.npy'):
      return candidate
  return path + '.npy'  # The older layout that Trax still reads.


def _staged_name(base, kind, step, token):
  """Where a sidecar is written before its pickle commits the set."""
  directory, name = os.path.split(base)
  return os.path.join(directory, f'.{name}.{kind}.{step}-{token}.npy.gz')


def _staged_pattern(base):
  return re.compile(
      r'^\.' + re.escape(os.path.basename(base)) +
      r'\.(weights|opt_slots\d+)\.\d+-[0-9a-f]{8}\.npy\.gz$')


def _read_sidecar(pkl_path, base, kind, record, max_bytes):
  """Reads sidecar `kind` of a pickle; `record` is what the pickle says of it."""
  fixed = f'{base}.{kind}.npy.gz'
  if record is None:  # Written by Trax: no checksum to tie it to the pickle.
    if kind == 'weights':
      fixed = _sidecar_weights_path(pkl_path)
    if not os.path.exists(fixed):
      raise CheckpointNotFoundError(
          f'{fixed}: missing; {pkl_path} keeps its {kind} in this file.')
    return npy_stream.read_npy_gz(fixed, max_bytes=max_bytes)
  if not isinstance(record, dict) or not isinstance(record.get('sha256'), str):
    raise CheckpointFormatError(f'{pkl_path}: malformed sidecar record {kind}.')
  staged = os.path.join(os.path.dirname(base), str(record.get('staged', '')))
  candidates = [p for p in (fixed, staged) if os.path.isfile(p)]
  if not candidates:
    raise CheckpointNotFoundError(
        f'{fixed}: missing; {pkl_path} keeps its {kind} in this file.')
  for candidate in candidates:
    try:
      return npy_stream.read_npy_gz(candidate, max_bytes=max_bytes,
                                    sha256=record['sha256'])
    except CheckpointCorruptedError as e:
      error = e
  raise CheckpointCorruptedError(
      f'{fixed} does not belong to {pkl_path} (step {record.get("step")}): '
      f'{error}')


def _scalar_or_keep(value):
  """History values: 0-d arrays and numpy scalars become Python numbers."""
  if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
    return value.item()
  return value


def normalize_history(history):
  """Returns `{mode: {metric: [(step, value), ...]}}` from any Trax history form.

  Accepts a `TraxHistory` record, Trax's `History.to_dict()` result
  (`{'_values': ...}`), or the plain mapping itself.
  """
  if history is None:
    return {}
  if isinstance(history, TraxHistory):
    history = history.to_dict()
  if not isinstance(history, dict):
    raise CheckpointFormatError(
        f'history must be a dict or History; got {type(history).__name__}.')
  values = history.get('_values', history)
  out = {}
  for mode, metrics in values.items():
    if not isinstance(metrics, dict):
      raise CheckpointFormatError(
          f'history[{mode!r}] must map metric names to lists; got '
          f'{type(metrics).__name__}.')
    out[mode] = {
        metric: [(int(step), _scalar_or_keep(v)) for step, v in entries]
        for metric, entries in metrics.items()}
  return out


def _flat_slots(slots):
  """Flattens a nested optimizer-slots tree, dropping `None` and `()`."""
  return [s for s in tree_leaves(slots) if s is not None]


def _detect_format(d):
  if 'flat_weights' not in d:
    if 'weights' in d:
      return 'legacy_pkl'
    raise CheckpointFormatError(
        f'not a Trax checkpoint: no flat_weights/weights entry (keys: '
        f'{sorted(map(str, d))}).')
  if isinstance(d['flat_weights'], int) and not isinstance(
      d['flat_weights'], bool):
    return 'loop'
  if 'opt_params' in d or isinstance(d.get('history'), TraxHistory):
    return 'trainer'
  if 'step' in d or 'slots_per_task' in d or 'flat_eval_state' in d:
    return 'loop'
  return 'layer'


def _read_slot_files(path, base, records, max_bytes):
  if records is not None:
    kinds = sorted((k for k in records if k.startswith('opt_slots')),
                   key=lambda k: int(k[len('opt_slots'):]))
    return [_read_sidecar(path, base, k, records[k], max_bytes) for k in kinds]
  slots, i = [], 0
  while os.path.exists(f'{base}.opt_slots{i}.npy.gz') or i == 0:
    slots.append(_read_sidecar(path, base, f'opt_slots{i}', None, max_bytes))
    i += 1
  return slots


def _sidecar_records(d, path):
  """The pickle's `retrax_sidecars` records (None in files Trax wrote)."""
  records = d.get(_SIDECARS_KEY)
  if records is None:
    return None
  if not isinstance(records, dict) or 'weights' not in records:
    raise CheckpointFormatError(f'{path}: malformed {_SIDECARS_KEY} entry.')
  for kind, record in records.items():
    if not isinstance(record, dict):
      raise CheckpointFormatError(f'{path}: malformed sidecar record {kind}.')
    if record.get('step') != d.get('step'):
      raise CheckpointFormatError(
          f'{path}: sidecar {kind} is recorded for step {record.get("step")}, '
          f'the pickle is of step {d.get("step")}.')
  return records


def _as_list(x, what, path):
  if x is None:
    return None
  if not isinstance(x, (list, tuple)):
    raise CheckpointFormatError(
        f'{path}: {what} must be a list; got {type(x).__name__}.')
  return list(x)


def _read_flat_layout(d, fmt, path, max_bytes, with_slots=True):
  """Weights, state and slots of a Loop/Trainer/Layer pickle `d`."""
  records = _sidecar_records(d, path)
  base = _base_of(path)
  flat_weights = d['flat_weights']
  if fmt == 'loop' and isinstance(flat_weights, int):
    flat_weights = _read_sidecar(path, base, 'weights', None if records is
                                 None else records.get('weights'), max_bytes)
  eval_state = d.get('flat_eval_state', d.get('flat_state'))
  out = {'flat_weights': _as_list(flat_weights, 'flat_weights', path),
         'flat_state': _as_list(d.get('flat_state'), 'flat_state', path),
         'flat_eval_state': _as_list(eval_state, 'flat_eval_state', path)}
  if not with_slots:
    out['slots'] = None
  elif isinstance(d.get('slots_per_task'), int):
    out['slots'] = _read_slot_files(path, base, records, max_bytes)
  elif d.get('slots_per_task') is not None:
    out['slots'] = [_flat_slots(s) for s in d['slots_per_task']]
  elif d.get('slots') is not None:
    out['slots'] = [_flat_slots(d['slots'])]
  else:
    out['slots'] = []
  return out


def read_trax_checkpoint(path, *, restore_bfloat16=False,
                         shape_dtype_factory=None, max_bytes=None,
                         with_slots=True):
  """Reads any Trax checkpoint layout into the normalized dict described above.

  Args:
    path: the `.pkl.gz` file (or a 1.2.x `.pkl`).
    restore_bfloat16: bit-cast uint16 weights/slots back to bfloat16, as Trax's
      `Loop._from_bits` does (every uint16 leaf is taken for bfloat16).
    shape_dtype_factory: if given, `(shape, dtype) -> record` used to convert
      the input signature (e.g. `retrax.shapes.ShapeDtype`); otherwise the
      signature holds `TraxShapeDtype` records.
    max_bytes: the size limit of each file and array (default: the module's).
    with_slots: False skips the optimizer-slot sidecars (`slots` is None):
      loading a model's weights needs no optimizer state.

  Returns:
    The normalized dict.

  Raises:
    UnsafeCheckpointError: the pickle references a non-admitted global.
    CheckpointCorruptedError: a file is truncated or damaged.
    CheckpointFormatError: the content is not a Trax checkpoint.
    CheckpointNotFoundError: the checkpoint or a sidecar it needs is missing.
    CheckpointLimitError: a file or array is over the size limit.

  A pickle written by retrax records each sidecar's sha256 and step: a
  sidecar of another save is refused. Sidecars written by Trax carry no
  checksum; they are read as they are (the loader still checks their count
  and shapes against the model).
  """
  path = os.fspath(path)
  d = load_trax_pickle(path, max_bytes)
  if not isinstance(d, dict):
    raise CheckpointFormatError(
        f'{path}: a Trax checkpoint pickles a dict; got {type(d).__name__}.')
  with malformed_is_format_error(path):
    return _normalized(d, path, restore_bfloat16, shape_dtype_factory,
                       max_bytes, with_slots)


def _step_of(d, path):
  step = d.get('step')
  if isinstance(step, np.integer):
    step = int(step)
  if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
    raise CheckpointFormatError(f'{path}: step {step!r:.40} is not an int.')
  return step


def _normalized(d, path, restore_bfloat16, shape_dtype_factory, max_bytes,
                with_slots):
  """`read_trax_checkpoint`'s dict of the unpickled `d`."""
  fmt = _detect_format(d)
  out = {'format': fmt, 'step': _step_of(d, path), 'opt_params': d.get(
      'opt_params'), 'version_timestamp': d.get('version_timestamp')}
  if fmt == 'legacy_pkl':
    out['flat_weights'] = tree_leaves(d['weights'])
    state = d['model_state'][0] if 'model_state' in d else d.get('state')
    out['flat_state'] = None if state is None else tree_leaves(state)
    out['flat_eval_state'] = out['flat_state']
    out['slots'] = [_flat_slots(d['slots'])] if d.get('slots') is not None else []
  else:
    out.update(_read_flat_layout(d, fmt, path, max_bytes, with_slots))
  if restore_bfloat16:
    out['flat_weights'] = npy_stream.from_bits(out['flat_weights'])
    if out['slots'] is not None:
      out['slots'] = [npy_stream.from_bits(s) for s in out['slots']]
  out['history'] = normalize_history(d.get('history'))
  signature = d.get('input_signature')
  if signature is not None and shape_dtype_factory is not None:
    signature = convert_shape_dtypes(signature, shape_dtype_factory)
  out['input_signature'] = signature
  return out


def _arrays(xs, what):
  if xs is None:
    return None
  out = []
  for i, x in enumerate(xs):
    if x is None or isinstance(x, (np.ndarray, np.generic, bool, int, float)):
      out.append(x)
    elif hasattr(x, '__array__') and hasattr(x, 'dtype'):
      out.append(np.asarray(x))  # jax arrays
    else:
      raise ArgumentTypeError(f'{what}[{i}] must be an array; got {type(x).__name__}.')
  return out


def _signature(sig):
  if sig is None:
    return None
  if is_shape_dtype(sig):
    return sig
  if isinstance(sig, (list, tuple)) and all(is_shape_dtype(s) for s in sig):
    return tuple(sig)
  raise ArgumentTypeError(
      f'input_signature must be a ShapeDtype or a tuple of them; got {sig!r}.')


def _write_pickle_gz(path, obj):
  with atomic_write(path) as f:
    with gzip.GzipFile(fileobj=f, mode='wb', compresslevel=2, mtime=0) as gz:
      pickle_writer.dump(obj, gz)


def write_trax_layer_file(path, flat_weights, flat_state=None,
                          input_signature=None):
  """Writes a `Layer.save_to_file` pickle that Trax's `init_from_file` reads.

  Args:
    path: file to write (conventionally `*.pkl.gz`); replaced atomically.
    flat_weights: list of arrays in Trax's flat order.
    flat_state: list of state arrays; None omits it (Trax's `weights_only`).
    input_signature: ShapeDtype or tuple of them; None omits it.
  """
  d = {'flat_weights': _arrays(flat_weights, 'flat_weights')}
  if flat_state is not None:
    d['flat_state'] = _arrays(flat_state, 'flat_state')
  if input_signature is not None:
    d['input_signature'] = _signature(input_signature)
  _write_pickle_gz(os.fspath(path), d)


def _trax_history(history):
  values = normalize_history(history)
  return {'_values': {
      mode: collections.defaultdict(list, {
          metric: [(int(s), _scalar_or_keep(v)) for s, v in entries]
          for metric, entries in metrics.items()})
      for mode, metrics in values.items()}}


def write_trax_loop_checkpoint(basename, step, flat_weights, flat_state,
                               flat_eval_state, history_dict, slots_per_task,
                               input_signature, compresslevel=2):
  """Writes the three-file layout of Trax's `Loop.save_checkpoint`.

  The set is written so that a kill at any instant leaves the old set or the
  new one for `read_trax_checkpoint`: each sidecar is first written (fsynced)
  under a name unique to this save, `.<name>.<kind>.<step>-<token>.npy.gz`;
  then `<basename>.pkl.gz` is replaced atomically, recording each sidecar's
  step, sha256 and staged name (the commit point); then the sidecars are
  renamed to Trax's names and the staged files of older, unfinished saves
  are removed. A reader finds each sidecar under one of its two names and
  checks its sha256. bfloat16 arrays are bit-cast to uint16, as Trax does.

  Args:
    basename: path without extension, e.g. `'/out/model'` (a trailing
      `.pkl.gz` is stripped).
    step: int training step.
    flat_weights: list of weight arrays (Trax flat order).
    flat_state: list of the train model's state arrays.
    flat_eval_state: list of the eval model's state arrays.
    history_dict: `{mode: {metric: [(step, value), ...]}}` or Trax's
      `History.to_dict()` form.
    slots_per_task: list (one per task) of flat lists of slot arrays; an
      empty list is stored inline (no slot files), so Trax restores weights and
      state and keeps fresh optimizer slots.
    input_signature: ShapeDtype or tuple of them (the model's inputs).
    compresslevel: gzip level of the npy files (Trax: 2, or 0 for the
      memory-efficient trainer); recorded in the pickle as Trax does.

  Returns:
    The path of the `.pkl.gz` file.
  """
  base = _base_of(os.fspath(basename))
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
    raise ArgumentTypeError(f'step must be an int; got {step!r}.')
  step, token = int(step), secrets.token_hex(4)
  sidecars = [(f'opt_slots{i}', _arrays(slots, f'slots_per_task[{i}]'))
              for i, slots in enumerate(slots_per_task)]
  sidecars.append(('weights', _arrays(flat_weights, 'flat_weights')))
  d = _loop_dict(step, compresslevel, flat_state, flat_eval_state,
                 history_dict, bool(slots_per_task), input_signature)
  pkl_path = base + _PICKLE_SUFFIX
  try:  # A save failing before its commit (a full disk) leaves no staged file.
    d[_SIDECARS_KEY] = _stage_sidecars(base, step, token, sidecars,
                                       compresslevel)
    _write_pickle_gz(pkl_path, d)  # The commit point.
  except BaseException as e:
    _remove_staged(base, step, token, sidecars)
    if isinstance(e, OSError):  # Name the checkpoint, not a staged file.
      raise naming(e, pkl_path) from None
    raise
  for kind, _ in sidecars:
    os.replace(_staged_name(base, kind, step, token), f'{base}.{kind}.npy.gz')
  fsync_dir(os.path.dirname(os.path.abspath(base)))
  remove_staged_sidecars(base, keep=())
  return pkl_path


def _loop_dict(step, compresslevel, flat_state, flat_eval_state, history_dict,
               has_slots, input_signature):
  """The dict Trax's `Loop` pickles, but for the sidecars' records."""
  return {
      'step': step,
      'flat_weights': compresslevel,
      'flat_state': _arrays(flat_state, 'flat_state'),
      'flat_eval_state': _arrays(flat_eval_state, 'flat_eval_state'),
      'history': _trax_history(history_dict),
      'slots_per_task': compresslevel if has_slots else [],
      'input_signature': _signature(input_signature),
      'version_timestamp': LOOP_VERSION_TIMESTAMP,
  }


def _stage_sidecars(base, step, token, sidecars, compresslevel):
  """Writes each `(kind, arrays)` under its staged name; returns the records
  (step, staged name, sha256) the pickle keeps of them."""
  records = {}
  for kind, arrays in sidecars:
    staged = _staged_name(base, kind, step, token)
    records[kind] = {'step': step, 'staged': os.path.basename(staged),
                     'sha256': npy_stream.write_npy_gz(
                         staged, arrays, compresslevel=compresslevel)}
  return records


def _remove_staged(base, step, token, sidecars):
  """Removes the staged files of a save that failed before its commit point."""
  for kind, _ in sidecars:
    with contextlib.suppress(OSError):
      os.remove(_staged_name(base, kind, step, token))


def remove_staged_sidecars(base, keep=None):
  """Removes the staged sidecars of unfinished saves of `<base>.pkl.gz`.

  Args:
    base: the checkpoint's path without `.pkl.gz`.
    keep: names to keep; None keeps those that `<base>.pkl.gz` names (a
      save killed after its commit point still needs them).

  Returns:
    The paths removed.
  """
  base = _base_of(os.fspath(base))
  directory = os.path.dirname(os.path.abspath(base))
  pattern = _staged_pattern(base)
  try:
    staged = [n for n in os.listdir(directory) if pattern.match(n)]
  except FileNotFoundError:
    return []
  if not staged:
    return []
  if keep is None:
    keep = set()
    with contextlib.suppress(CheckpointError, OSError, AttributeError):
      records = load_trax_pickle(base + _PICKLE_SUFFIX).get(_SIDECARS_KEY)
      keep = {r.get('staged') for r in (records or {}).values()}
  removed = []
  for name in staged:
    if name not in keep:
      with contextlib.suppress(OSError):
        os.remove(os.path.join(directory, name))
        removed.append(os.path.join(directory, name))
  return removed


_ANY_STAGED_RE = re.compile(
    r'^\.(?P<base>.+)\.(weights|opt_slots\d+)\.\d+-[0-9a-f]{8}\.npy\.gz$')


def remove_orphan_staged_sidecars(directory):
  """`remove_staged_sidecars` for every basename with staged files in
  `directory`; returns the paths removed."""
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  bases = {m.group('base') for m in map(_ANY_STAGED_RE.match, names) if m}
  return [p for b in sorted(bases)
          for p in remove_staged_sidecars(os.path.join(directory, b))]
