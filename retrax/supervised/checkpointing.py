"""Saving and restoring a `Loop`'s `TrainState`: plain functions of the state.

A training checkpoint is a native checkpoint directory (safetensors + JSON,
checksummed, written atomically; see `retrax.checkpoints.native`) holding the
trees

  weights, state        the model's (Trax's flat order when flattened)
  eval_state            the eval model's state
  loss_weights, loss_state, slots, opt_params
                        one entry per training task
  rng                   the loop's PRNG key (what the next step will split)
  input_signature       the model's inputs, so `Layer.init_from_file` reads it

and the metadata `step`, `history`, `batches` (how many batches each train /
eval stream has delivered: on resume the streams are read again from their
start and that many batches skipped, so a resumed run sees the same data only
if each stream yields the same batches every time it is created), `kind` and
`accumulator` (the `LossSums` since the last logged mean).

    host = placement.to_host(train_state)          # once per save
    save_state(path, host, input_signature=sig, history=h, batches=b)
    save_trax_state(f'{output_dir}/model', host, h, sig)
    train_state, meta = restore_state(path, template_state)

A state split over several processes (FSDP over processes) is saved by every
process with `save_split_in_dir`: each writes the pieces it holds, nothing
is gathered, and Trax's files are not written; it restores like any other.

Rolling checkpoints are `<output_dir>/ckpt_<step>` (the `keep` of highest
recorded step are kept), permanent ones `<output_dir>/model_<step>`.
Resuming takes the checkpoint of either kind with the highest recorded step
whose checksums verify; a corrupted or half-written one is reported and
skipped; when checkpoints exist but none is usable, resuming is an error (a
run never silently starts over).
"""

import logging
import os
import re
import typing

import numpy as np

from retrax import checkpoints as ckpt_lib
from retrax.checkpoints import errors as ckpt_errors
from retrax.checkpoints import ownership
from retrax.run_layout import PERMANENT_PREFIX
from retrax.run_layout import ROLLING_PREFIX
from retrax.run_layout import TRAX_BASENAME
from retrax.shapes import ShapeDtype
from retrax.supervised import history as trax_history
from retrax.supervised import loop_steps
from retrax.supervised.batch_checks import NonFiniteLossError
from retrax.supervised.train_step import TrainState

FORMAT_KIND_VERSION = 1
_NAME_RE = re.compile(f'^({ROLLING_PREFIX}|{PERMANENT_PREFIX})(\\d+)$')
_TASK_FIELDS = ('loss_weights', 'loss_state', 'slots', 'opt_params')

_log = logging.getLogger('retrax.supervised')


# --- native checkpoints ------------------------------------------------------------


def _trees(host_state, input_signature):
  """The checkpoint's trees (the file layout) of a host `TrainState`."""
  trees = {'weights': host_state.weights, 'state': host_state.state,
           'eval_state': host_state.eval_state}
  for field in _TASK_FIELDS:
    trees[field] = tuple(getattr(t, field) for t in host_state.tasks)
  trees['rng'] = host_state.rng
  trees['input_signature'] = input_signature
  return trees


def save_state(path, host_state, *, input_signature, history, batches,
               kind='Loop', loss_sums=None):
  """Writes `host_state` (numpy arrays) as a training checkpoint; returns `path`.

  Args:
    path: the checkpoint directory (replaced atomically if it exists).
    host_state: a `TrainState` whose arrays are on the host.
    input_signature: the model's input signature.
    history: the `History` (its values are saved).
    batches: `{'train': [n, ...], 'eval': [n, ...]}` batches each stream gave.
    kind: 'Loop' or 'Trainer' (what wrote it).
    loss_sums: `LossSums.to_dict()`, so a resumed run logs the same means.
  """
  return ckpt_lib.save_native(path, _trees(host_state, input_signature),
                              _metadata(host_state.step, history, batches,
                                        kind, loss_sums))


def _metadata(step, history, batches, kind, loss_sums):
  metadata = {'kind': kind, 'kind_version': FORMAT_KIND_VERSION,
              'step': int(step), 'history': history.to_dict()['_values'],
              'batches': batches}
  if loss_sums is not None:
    metadata['accumulator'] = loss_sums
  return metadata


_CHECKED_PARTS = ('weights', 'slots')


def _non_finite_part(host_state):
  """0 if the weights and optimizer slots of `host_state` are finite, else
  1 + the index in `_CHECKED_PARTS` of the first that holds NaN/inf (of a
  split array, the pieces held here are checked)."""
  for i, tree in enumerate((host_state.weights,
                            tuple(t.slots for t in host_state.tasks))):
    for x in ckpt_lib.tree_leaves(tree):
      pieces = ([p for _, p in x.pieces] if isinstance(x, ckpt_lib.Shards)
                else [x])
      for p in pieces:
        a = np.asarray(p) if hasattr(p, 'dtype') else None
        if a is None or a.dtype.kind not in 'fcV':
          continue
        if not np.all(np.isfinite(a.astype(np.float32) if a.dtype.kind == 'V'
                                  else a)):
          return i + 1
  return 0


def _non_finite_error(step, part, last_saved_step):
  last = ('no checkpoint was saved' if last_saved_step is None else
          f'the last checkpoint is from step {last_saved_step}')
  return NonFiniteLossError(
      f'Step {step}: the {_CHECKED_PARTS[part - 1]} hold NaN or inf, so they '
      f'are not saved ({last}). Check the learning rate and the data, or '
      'clip gradients (clip_grad_norm=).')


def check_finite(host_state, last_saved_step):
  """Raises `NonFiniteLossError` if the weights or optimizer slots of
  `host_state` hold NaN/inf: such a state is never saved."""
  part = _non_finite_part(host_state)
  if part:
    raise _non_finite_error(host_state.step, part, last_saved_step)


def _like(loaded, template, what):
  """`loaded`'s leaves in `template`'s structure (shapes checked, dtypes kept)."""
  return ckpt_lib.unflatten_like(ckpt_lib.tree_leaves(loaded), template,
                                 what=what)


def restore_state(path, template):
  """Reads a training checkpoint written by `save_state`.

  Args:
    path: the checkpoint directory.
    template: a `TrainState` of the loop that restores (structures, shapes
      and dtypes to match).

  Returns:
    `(TrainState, metadata)`: host arrays in `template`'s structures; the
    metadata has 'step', 'history' (`History` values), 'batches' and, when
    saved, 'accumulator'.

  Raises:
    CheckpointCorruptedError / CheckpointFormatError: damaged or foreign files,
      or a `ckpt_<step>`/`model_<step>` name that differs from the recorded
      step.
    TreeStructureError: it was written for another model or number of tasks.
  """
  loaded = ckpt_lib.load_native(path)
  trees, meta = loaded.trees, loaded.metadata
  step = meta.get('step')
  if meta.get('kind') not in ('Loop', 'Trainer') or isinstance(
      step, bool) or not isinstance(step, int):
    raise ckpt_lib.CheckpointFormatError(
        f'{path} is a native checkpoint but not a training checkpoint (it has '
        f'no training step); load it with Layer.init_from_file instead.')
  m = _NAME_RE.match(os.path.basename(os.path.normpath(path)))
  if m and int(m.group(2)) != meta['step']:
    raise ckpt_lib.mismatch_error(path, int(m.group(2)), meta['step'])
  if len(trees['slots']) != len(template.tasks):
    raise ckpt_lib.TreeStructureError(
        f'{path} holds {len(trees["slots"])} training task(s); this loop has '
        f'{len(template.tasks)}.')
  tasks = tuple(
      t._replace(**{f: _like(trees[f][i], getattr(t, f), f)
                    for f in _TASK_FIELDS})
      for i, t in enumerate(template.tasks))
  return TrainState(
      int(meta['step']), _like(trees['weights'], template.weights, 'weights'),
      _like(trees['state'], template.state, 'state'),
      _like(trees['eval_state'], template.eval_state, 'eval_state'), tasks,
      np.asarray(trees['rng'])), meta


# --- Trax's files ------------------------------------------------------------------


def save_trax_state(basename, host_state, history, input_signature):
  """Writes Trax's `Loop` files `<basename>.pkl.gz` (+ sidecars) of a host
  `TrainState`, readable by Trax 1.4 and `Layer.init_from_file`."""
  leaves = ckpt_lib.tree_leaves
  return ckpt_lib.write_trax_loop_checkpoint(
      basename, host_state.step, leaves(host_state.weights),
      leaves(host_state.state), leaves(host_state.eval_state),
      history.to_dict(),
      [[s for s in leaves(t.slots) if s is not None] for t in host_state.tasks],
      input_signature)


def read_trax_checkpoint(path):
  """A Trax `.pkl.gz` (Loop, Trainer or 1.2 `.pkl`) as retrax's normalized dict."""
  return ckpt_lib.read_trax_checkpoint(path, restore_bfloat16=True,
                                       shape_dtype_factory=ShapeDtype)


def _trax_slots(path, flat, template_slots):
  leaves = ckpt_lib.tree_leaves(template_slots)
  present = [i for i, x in enumerate(leaves) if x is not None]
  if len(present) != len(flat):
    raise ckpt_lib.TreeStructureError(
        f'{path}: {len(flat)} optimizer slot arrays for an optimizer with '
        f'{len(present)}; was it written with another optimizer?')
  for i, x in zip(present, flat):
    leaves[i] = x
  return ckpt_lib.unflatten_like(leaves, template_slots, what='slots')


def restore_trax_state(path, template):
  """Reads Trax's `Loop`/`Trainer` checkpoint into `template`'s structures.

  Weights, state, eval state, optimizer slots and the step come from the
  file; what Trax does not save (loss layer arrays, optimizer
  hyperparameters, the PRNG key) stays as in `template`.

  Returns:
    `(TrainState, history dict)`.
  """
  d = read_trax_checkpoint(path)
  new = {'step': int(d['step'] or 0),
         'weights': ckpt_lib.unflatten_like(d['flat_weights'],
                                            template.weights, what='weights')}
  for field in ('state', 'eval_state'):
    if d['flat_' + field] is not None:
      new[field] = ckpt_lib.unflatten_like(
          d['flat_' + field], getattr(template, field), what=field)
  if d['slots'] and len(d['slots']) != len(template.tasks):
    raise ckpt_lib.TreeStructureError(
        f'{path} holds optimizer slots for {len(d["slots"])} training '
        f'task(s); this loop has {len(template.tasks)} (is a '
        '.opt_slots<i>.npy.gz file missing?).')
  if d['slots']:
    new['tasks'] = tuple(
        t._replace(slots=_trax_slots(path, flat, t.slots))
        for t, flat in zip(template.tasks, d['slots']))
  return template._replace(**new), d['history']


def trax_checkpoint_path(directory, filename=None):
  """The Trax-format file `<directory>/<filename or 'model'>.pkl.gz` if present."""
  base = os.path.join(directory, filename or TRAX_BASENAME)
  for candidate in (base, base + '.pkl.gz', base + '.pkl'):
    if os.path.isfile(candidate):
      return candidate
  return None


def trax_file_step(path):
  """The step of the Trax checkpoint `path`, or None if missing/unreadable."""
  if not os.path.isfile(path):
    return None
  try:
    d = ckpt_lib.read_trax_checkpoint(path)
  except (ckpt_lib.CheckpointError, OSError):
    return None
  return d.get('step')


# --- an output directory's checkpoints ----------------------------------------


def rolling_path(output_dir, step):
  """`<output_dir>/ckpt_<step>`: a rolling checkpoint (the newest are kept)."""
  return ckpt_lib.checkpoint_path(output_dir, step, ROLLING_PREFIX)


def permanent_path(output_dir, step):
  """`<output_dir>/model_<step>`: a permanent checkpoint (never deleted)."""
  return ckpt_lib.checkpoint_path(output_dir, step, PERMANENT_PREFIX)


def save_path(output_dir, step, basename=None, permanent=False):
  """Where a save goes: `<output_dir>/<basename>`, else the permanent or the
  rolling checkpoint of `step`."""
  if basename is not None:
    return os.path.join(output_dir, basename)
  return (permanent_path if permanent else rolling_path)(output_dir, step)


def trax_basename(step, basename=None, permanent=False):
  """The name of Trax's files of a save: `basename`, `model_<step>` for a
  permanent checkpoint, else `model`."""
  if basename is not None:
    return basename
  return f'{TRAX_BASENAME}_{step}' if permanent else TRAX_BASENAME


def stale_trax_names(output_dir, step):
  """Names of Trax's files that should hold `step`'s native checkpoints
  (`model` for `ckpt_<step>`, `model_<step>` for `model_<step>`) but do not:
  a kill came between the native save and theirs."""
  names = [trax_basename(step, permanent=permanent)
           for permanent in (False, True)
           if ckpt_lib.is_native_checkpoint(
               save_path(output_dir, step, permanent=permanent))]
  return [n for n in names if trax_file_step(
      os.path.join(output_dir, n + '.pkl.gz')) != step]


def skip_consumed_batches(tasks_by_kind, batches, report):
  """Moves each stream to where the checkpoint's `batches` says it was.

  Args:
    tasks_by_kind: `{'train': [task, ...], 'eval': [task, ...]}`.
    batches: the checkpoint's `{'train': [n, ...], 'eval': [n, ...]}`.
    report: called with a note for a stream already past its count.
  """
  for kind, tasks in tasks_by_kind.items():
    for i, (task, n) in enumerate(zip(tasks, batches.get(kind, []))):
      if n >= task.n_batches:
        task.skip(n - task.n_batches)  # Re-read the stream up to there.
      else:
        report(f'Note: {kind} stream {i} has delivered {task.n_batches} '
               f'batches, more than the {n} of the checkpoint; it goes on '
               'from where it is (a resumed run sees other data).')


def _find_named(directory, filename):
  """`('native', path)` or `('trax', path)` of checkpoint `filename`."""
  path = os.path.join(directory, filename)
  if ckpt_lib.is_native_checkpoint(path):
    return 'native', path
  trax_path = trax_checkpoint_path(directory, filename)
  if trax_path is None:
    raise ckpt_lib.CheckpointNotFoundError(
        f'No checkpoint named {filename!r} in {directory} (neither a '
        'native checkpoint directory nor a Trax .pkl.gz file).')
  return 'trax', trax_path


class Restored(typing.NamedTuple):
  """What `load_state` read: `kind` ('native' or 'trax'), `path`, the host
  `state`, `history` (a dict for `History.from_dict`), the streams'
  `batches` ({} from Trax's files) and the `loss_sums` (or None)."""
  kind: str
  path: str
  state: TrainState
  history: dict
  batches: dict
  loss_sums: typing.Optional[dict]


def load_state(directory, filename, template, report=None):
  """Reads checkpoint `filename` of `directory` (None: what a loop there
  resumes from, see `find_resume_checkpoint`) into `template`'s structures.

  Returns:
    A `Restored`, or None when `filename` is None and there is nothing.

  Raises:
    CheckpointNotFoundError: no checkpoint named `filename`.
    CheckpointError / TreeStructureError: see `restore_state`.
  """
  found = (find_resume_checkpoint(directory, report) if filename is None
           else _find_named(directory, filename))
  if found is None:
    return None
  kind, path = found
  if kind == 'trax':
    state, history = restore_trax_state(path, template)
    return Restored(kind, path, state, history, {}, None)
  state, meta = restore_state(path, template)
  restored = Restored(kind, path, state, meta.get('history'),
                      meta.get('batches', {}), meta.get('accumulator'))
  _check_positions(restored)
  return restored


def _check_positions(restored):
  """Raises `CheckpointFormatError` unless a native checkpoint's history,
  stream positions and loss sums are of the forms a resume uses."""
  batches = restored.batches
  if not isinstance(batches, dict) or not all(
      isinstance(counts, list) and all(
          isinstance(n, int) and not isinstance(n, bool) and n >= 0
          for n in counts) for counts in batches.values()):
    raise ckpt_lib.CheckpointFormatError(
        f'{restored.path}: malformed stream positions (batches).')
  with ckpt_errors.malformed_is_format_error(restored.path):
    trax_history.History.from_dict(restored.history)
    loop_steps.LossSums().load(restored.loss_sums)


def save_in_dir(output_dir, host_state, basename=None, permanent=False, *,
                keep, write_trax_files, report=None, **state_info):
  """Saves `host_state` in `output_dir` under a `Loop`'s names; returns the
  checkpoint's path.

  Args:
    output_dir: the run's directory.
    host_state: a `TrainState` on the host.
    basename, permanent: `<output_dir>/<basename>`, else the permanent
      `model_<step>`, else the rolling `ckpt_<step>` (then all but the newest
      `keep` rolling ones are deleted; `report` hears of unusable ones).
    keep: rolling checkpoints to keep.
    write_trax_files: also write Trax's files (`model`, `model_<step>` or
      `<basename>`, see `save_trax_state`).
    report: called with messages about unusable checkpoints.
    **state_info: `save_state`'s keyword arguments (`input_signature`,
      `history`, `batches`, `kind`, `loss_sums`).
  """
  step = host_state.step
  path = ownership.check_inside(output_dir, save_path(output_dir, step,
                                                      basename, permanent))
  trax_base = ownership.check_inside(output_dir, os.path.join(
      output_dir, trax_basename(step, basename, permanent)))
  save_state(path, host_state, **state_info)
  if basename is None and not permanent:
    ckpt_lib.rotate_checkpoints(output_dir, keep, ROLLING_PREFIX,
                                report=report)
  if write_trax_files:
    save_trax_state(trax_base, host_state, state_info['history'],
                    state_info['input_signature'])
  return path


def save_split_in_dir(output_dir, local_state, basename=None,
                      permanent=False, *, keep, process_index, process_count,
                      token, gather_ints, last_saved_step, report=None,
                      **state_info):
  """`save_in_dir` of a state split over processes, called by every process
  at the same point: each writes the pieces it holds, process 0 commits (and
  rotates); Trax's files are not written (they would need whole arrays).

  Args:
    output_dir, basename, permanent, keep, report, **state_info: as
      `save_in_dir`'s (`state_info` is used by process 0).
    local_state: `sharding.local_shards` of the `TrainState`.
    process_index, process_count: this process and how many there are.
    token: 16 hex digits, the same on every process, new for each save.
    gather_ints: `gather_ints(n) -> [n of each process]`, a collective.
    last_saved_step: for the message when the state is not finite.

  Returns:
    The checkpoint's path.

  Raises:
    NonFiniteLossError: on every process when any holds NaN/inf.
  """
  step = local_state.step
  path = ownership.check_inside(output_dir, save_path(output_dir, step,
                                                      basename, permanent))
  # Every process learns of NaN/inf held anywhere, so all stop alike.
  part = max(gather_ints(_non_finite_part(local_state)))
  if part:
    raise _non_finite_error(step, part, last_saved_step)
  ckpt_lib.save_native_sharded(
      path, _trees(local_state, state_info['input_signature']),
      _metadata(step, state_info['history'], state_info['batches'],
                state_info.get('kind', 'Loop'), state_info.get('loss_sums')),
      process_index=process_index, process_count=process_count, token=token,
      all_ok=lambda ok: [bool(v) for v in gather_ints(int(ok))])
  if process_index == 0 and basename is None and not permanent:
    ckpt_lib.rotate_checkpoints(output_dir, keep, ROLLING_PREFIX,
                                report=report)
  return path


def remove_orphans(output_dir, log_files=()):
  """Removes the temporary files that killed writes left in `output_dir`, its
  checkpoint directories and beside the run's `log_files` (only names of
  retrax's own temporary files, only inside `output_dir`: never through a
  symlink)."""
  removed = ckpt_lib.remove_orphan_temps(output_dir)
  for path in log_files:
    ownership.check_inside(output_dir, path, 'clean up beside')
    removed += ckpt_lib.remove_orphan_temps(os.path.dirname(path),
                                            {os.path.basename(path)})
  removed += ckpt_lib.remove_orphan_staged_sidecars(output_dir)
  for prefix in (ROLLING_PREFIX, PERMANENT_PREFIX):
    for _, path in ckpt_lib.list_checkpoints(output_dir, prefix):
      if not os.path.islink(path) and ownership.is_inside(output_dir, path):
        removed += ckpt_lib.remove_orphan_temps(path)
  for path in removed:
    _log.info('Removed %s, left by an interrupted write.', path)
  return removed


def _newest_usable(directory, report):
  def say(message):
    _log.warning(message)
    if report is not None:
      report(message)
  return ckpt_lib.newest_usable(directory, (ROLLING_PREFIX, PERMANENT_PREFIX),
                                report=say)


def find_latest_valid(directory, report=None):
  """The verified checkpoint (rolling or permanent) of the highest recorded
  step in `directory`, or None.

  Args:
    directory: the output directory.
    report: called with a message for each checkpoint that fails its checks
      (truncated, corrupted, half-written).

  Raises:
    CheckpointFormatError: a checkpoint's name and recorded step differ.
  """
  return _newest_usable(directory, report)[0]


def saved_step(directory):
  """The highest step a checkpoint in `directory` records (its metadata
  verified), or None: what a run there has kept."""
  try:
    usable = [e for e in ckpt_lib.scan_checkpoints(
        directory, (ROLLING_PREFIX, PERMANENT_PREFIX), full=False)
              if e.error is None]
  except (ckpt_lib.CheckpointError, OSError):
    return None
  return usable[-1].step if usable else None


def find_resume_checkpoint(directory, report=None):
  """What a loop in `directory` resumes from: `('native', path)`,
  `('trax', path)` (Trax's `model.pkl.gz`, when no native checkpoint is
  usable) or None for a fresh start.

  Raises:
    CheckpointError: checkpoints exist but none is usable (the message names
      each one and what is wrong); a name/step mismatch.
  """
  path, problems = _newest_usable(directory, report)
  if path is not None:
    return 'native', path
  trax_path = trax_checkpoint_path(directory)
  if trax_path is not None:
    return 'trax', trax_path
  if problems:
    details = '; '.join(f'{p}: {why}' for p, why in problems)
    raise ckpt_lib.CheckpointError(
        f'{directory} holds checkpoints but none is usable, so training does '
        f'not start over: {details}. Repair or move them away to start afresh.')
  return None
