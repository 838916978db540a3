"""Glue between a training loop's state and `retrax.checkpoints`.

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
if each stream yields the same batches every time it is created) and `kind`.

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

import jax
import numpy as np

from retrax import checkpoints as ckpt_lib
from retrax.supervised.batch_checks import NonFiniteLossError

ROLLING_PREFIX = 'ckpt_'
PERMANENT_PREFIX = 'model_'
TRAX_BASENAME = 'model'
FORMAT_KIND_VERSION = 1
_NAME_RE = re.compile(f'^({ROLLING_PREFIX}|{PERMANENT_PREFIX})(\\d+)$')

_log = logging.getLogger('retrax.supervised')


def to_host(tree):
  """A copy of `tree` with every array as numpy (replicated arrays: one copy)."""
  def fetch(x):
    if isinstance(x, jax.Array):
      if not x.is_fully_addressable:
        x = x.addressable_data(0)
      return np.asarray(x)
    return x
  return jax.tree_util.tree_map(fetch, tree)


def save_training_checkpoint(path, trees, step, history_dict, batches, kind,
                             accumulator=None):
  """Writes one training checkpoint directory (atomically); returns `path`.

  `accumulator` (JSON-able) is the loop's running sums of the losses since
  the last logged mean, so that a resumed run logs the same means.
  """
  metadata = {'kind': kind, 'kind_version': FORMAT_KIND_VERSION,
              'step': int(step), 'history': history_dict, 'batches': batches}
  if accumulator is not None:
    metadata['accumulator'] = accumulator
  return ckpt_lib.save_native(path, to_host(trees), metadata)


def check_finite(trees, step, last_saved_step):
  """Raises `NonFiniteLossError` if the weights or optimizer slots of host
  `trees` hold NaN/inf: such a state is never saved."""
  for name in ('weights', 'slots'):
    for x in ckpt_lib.tree_leaves(trees[name]):
      a = np.asarray(x) if hasattr(x, 'dtype') else None
      if a is None or a.dtype.kind not in 'fcV':
        continue
      if not np.all(np.isfinite(a.astype(np.float32) if a.dtype.kind == 'V'
                                else a)):
        last = ('no checkpoint was saved' if last_saved_step is None else
                f'the last checkpoint is from step {last_saved_step}')
        raise NonFiniteLossError(
            f'Step {step}: the {name} hold NaN or inf, so they are not saved '
            f'({last}). Check the learning rate and the data, or clip '
            'gradients (clip_grad_norm=).')


def remove_orphans(output_dir, log_files=()):
  """Removes the temporary files that killed writes left in `output_dir`, its
  checkpoint directories and beside the run's `log_files` (only names of
  retrax's own temporary files)."""
  removed = ckpt_lib.remove_orphan_temps(output_dir)
  for path in log_files:
    removed += ckpt_lib.remove_orphan_temps(os.path.dirname(path),
                                            {os.path.basename(path)})
  removed += ckpt_lib.remove_orphan_staged_sidecars(output_dir)
  for prefix in (ROLLING_PREFIX, PERMANENT_PREFIX):
    for _, path in ckpt_lib.list_checkpoints(output_dir, prefix):
      removed += ckpt_lib.remove_orphan_temps(path)
  for path in removed:
    _log.info('Removed %s, left by an interrupted write.', path)
  return removed


def rolling_path(output_dir, step):
  return ckpt_lib.checkpoint_path(output_dir, step, ROLLING_PREFIX)


def permanent_path(output_dir, step):
  return ckpt_lib.checkpoint_path(output_dir, step, PERMANENT_PREFIX)


def rotate(output_dir, keep, report=None):
  """Deletes all but the `keep` usable rolling checkpoints of highest step."""
  return ckpt_lib.rotate_checkpoints(output_dir, keep, ROLLING_PREFIX,
                                     report=report)


def _say(message, report):
  _log.warning(message)
  if report is not None:
    report(message)


def _newest_usable(directory, report):
  """`(path or None, [(path, why) of each unusable checkpoint])`."""
  entries = ckpt_lib.scan_checkpoints(
      directory, (ROLLING_PREFIX, PERMANENT_PREFIX), full=False)
  problems = []
  for e in entries:
    if e.error is not None:
      _say(f'Checkpoint of step {e.name_step} at {e.path} is unusable and was '
           f'skipped: {e.error}', report)
      if not e.incomplete:
        problems.append((e.path, e.error))
  for e in reversed([e for e in entries if e.error is None]):
    try:
      ckpt_lib.verify_native(e.path)
    except (ckpt_lib.CheckpointError, OSError) as err:
      _say(f'Checkpoint of step {e.step} at {e.path} is unusable and was '
           f'skipped: {err}', report)
      problems.append((e.path, str(err)))
      continue
    return e.path, problems
  return None, problems


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


def load_training_checkpoint(path):
  """Loads a training checkpoint written by `save_training_checkpoint`.

  Returns:
    `(trees, metadata)`.

  Raises:
    CheckpointCorruptedError / CheckpointFormatError: damaged or foreign files,
      or a `ckpt_<step>`/`model_<step>` name that differs from the recorded
      step.
  """
  loaded = ckpt_lib.load_native(path)
  meta = loaded.metadata
  if meta.get('kind') not in ('Loop', 'Trainer') or 'step' not in meta:
    raise ckpt_lib.CheckpointFormatError(
        f'{path} is a native checkpoint but not a training checkpoint (it has '
        f'no training step); load it with Layer.init_from_file instead.')
  m = _NAME_RE.match(os.path.basename(os.path.normpath(path)))
  if m and int(m.group(2)) != meta['step']:
    raise ckpt_lib.mismatch_error(path, int(m.group(2)), meta['step'])
  return loaded.trees, meta


def restore_like(loaded, template, what):
  """`loaded`'s leaves in `template`'s structure (shapes checked, dtypes kept)."""
  return ckpt_lib.unflatten_like(ckpt_lib.tree_leaves(loaded), template,
                                 what=what)


def read_trax_checkpoint(path):
  """A Trax `.pkl.gz` (Loop, Trainer or 1.2 `.pkl`) as retrax's normalized dict."""
  from retrax.shapes import ShapeDtype  # pylint: disable=g-import-not-at-top
  return ckpt_lib.read_trax_checkpoint(path, restore_bfloat16=True,
                                       shape_dtype_factory=ShapeDtype)


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


def write_trax_checkpoint(basename, step, flat_weights, flat_state,
                          flat_eval_state, history_dict, slots_per_task,
                          input_signature):
  """Also writes Trax's three-file `Loop` layout (readable by Trax 1.4)."""
  return ckpt_lib.write_trax_loop_checkpoint(
      basename, step, to_host(flat_weights), to_host(flat_state),
      to_host(flat_eval_state), history_dict,
      [to_host(s) for s in slots_per_task], input_signature)
