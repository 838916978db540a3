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

Rolling checkpoints are `<output_dir>/ckpt_<step>` (the newest `keep` are
kept), permanent ones `<output_dir>/model_<step>`. Resuming takes the newest
checkpoint of either kind whose checksums verify; a corrupted or half-written
newer one is reported and skipped.
"""

import logging
import os

import jax
import numpy as np

from retrax import checkpoints as ckpt_lib

ROLLING_PREFIX = 'ckpt_'
PERMANENT_PREFIX = 'model_'
TRAX_BASENAME = 'model'
FORMAT_KIND_VERSION = 1

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


def save_training_checkpoint(path, trees, step, history_dict, batches, kind):
  """Writes one training checkpoint directory (atomically); returns `path`."""
  metadata = {'kind': kind, 'kind_version': FORMAT_KIND_VERSION,
              'step': int(step), 'history': history_dict, 'batches': batches}
  return ckpt_lib.save_native(path, to_host(trees), metadata)


def rolling_path(output_dir, step):
  return ckpt_lib.checkpoint_path(output_dir, step, ROLLING_PREFIX)


def permanent_path(output_dir, step):
  return ckpt_lib.checkpoint_path(output_dir, step, PERMANENT_PREFIX)


def rotate(output_dir, keep):
  """Deletes all but the newest `keep` rolling checkpoints."""
  return ckpt_lib.rotate_checkpoints(output_dir, keep, ROLLING_PREFIX)


def find_latest_valid(directory, report=None):
  """Newest verified checkpoint path (rolling or permanent) in `directory`.

  Args:
    directory: the output directory.
    report: called with a message for each newer checkpoint that fails its
      checks (truncated, corrupted, half-written).

  Returns:
    The path, or None if there is none.
  """
  candidates = (ckpt_lib.list_checkpoints(directory, ROLLING_PREFIX) +
                ckpt_lib.list_checkpoints(directory, PERMANENT_PREFIX))
  for step, path in sorted(candidates, reverse=True):
    try:
      ckpt_lib.verify_native(path)
    except (ckpt_lib.CheckpointError, OSError) as e:
      message = (f'Checkpoint of step {step} at {path} is unusable and was '
                 f'skipped: {e}')
      _log.warning(message)
      if report is not None:
        report(message)
      continue
    return path
  return None


def load_training_checkpoint(path):
  """Loads a training checkpoint written by `save_training_checkpoint`.

  Returns:
    `(trees, metadata)`.

  Raises:
    CheckpointCorruptedError / CheckpointFormatError: damaged or foreign files.
  """
  loaded = ckpt_lib.load_native(path)
  meta = loaded.metadata
  if meta.get('kind') not in ('Loop', 'Trainer') or 'step' not in meta:
    raise ckpt_lib.CheckpointFormatError(
        f'{path} is a native checkpoint but not a training checkpoint (it has '
        f'no training step); load it with Layer.init_from_file instead.')
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


def write_trax_checkpoint(basename, step, flat_weights, flat_state,
                          flat_eval_state, history_dict, slots_per_task,
                          input_signature):
  """Also writes Trax's three-file `Loop` layout (readable by Trax 1.4)."""
  return ckpt_lib.write_trax_loop_checkpoint(
      basename, step, to_host(flat_weights), to_host(flat_state),
      to_host(flat_eval_state), history_dict,
      [to_host(s) for s in slots_per_task], input_signature)
