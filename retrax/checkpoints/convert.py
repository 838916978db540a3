"""Converting between Trax checkpoints and retrax native checkpoints.

`retrax convert SRC DST [--to native|trax|hf]` calls `convert`; Hugging
Face's Reformer directories (to and from retrax runs, which build models)
are `retrax.app.hf_runs`' (the CLI sends them there).

Trax -> native writes the trees `weights`, `state`, `eval_state` (flat lists
in Trax's order), `trax_slots` (Trax's flat optimizer slots per task) and
`input_signature`, with `step`, `history` and `converted_from` in the
metadata. `Layer.init_from_file` reads the result.

native -> Trax writes the `Loop` layout (`DST.pkl.gz`, `DST.weights.npy.gz`,
and `DST.opt_slots{i}.npy.gz` per training task): the slots come from a
converted checkpoint's `trax_slots` or a training checkpoint's `slots` (one
tree per task, Trax's slot layout; its empty entries are skipped, as Trax
stores them). Without either, Trax restores weights and state and starts
fresh slots.

Nothing at DST is lost by default: the native target must be a new path or an
empty directory; the Trax target (an existing directory gets `model.*`) must
not have any of the files it would write (`.pkl.gz`, `.weights.npy.gz`,
`.opt_slots*.npy.gz` of that basename), and an existing directory it writes
into must be empty. `force=True` (`--force`) writes anyway and replaces only
those files (native: `metadata.json` and its `arrays.*.safetensors`); other
files are never deleted or changed.
"""

import os

from retrax import local_paths
from retrax import run_layout
from retrax.checkpoints import hf_files
from retrax.checkpoints import native
from retrax.checkpoints.destination import check_destination
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import malformed_is_format_error
from retrax.checkpoints import trax_format
from retrax.checkpoints.tree import tree_leaves
from retrax.shapes import ShapeDtype
from retrax.validation import ArgumentValueError

FORMATS = ('native', 'trax')


def _shape_dtype():
  return ShapeDtype


def trax_to_native(src, dst):
  """Converts a Trax `.pkl.gz` (any layout) to a native checkpoint directory."""
  ckpt = trax_format.read_trax_checkpoint(src, restore_bfloat16=True,
                                          shape_dtype_factory=_shape_dtype())
  trees = {'weights': ckpt['flat_weights'],
           'state': ckpt['flat_state'] or [],
           'eval_state': ckpt['flat_eval_state'] or [],
           'trax_slots': ckpt['slots']}
  if ckpt['input_signature'] is not None:
    trees['input_signature'] = ckpt['input_signature']
  metadata = {'step': ckpt['step'], 'history': ckpt['history'],
              'converted_from': {'format': f'trax-{ckpt["format"]}',
                                 'file': os.path.basename(os.fspath(src))}}
  return native.save_native(dst, trees, metadata)


def native_to_trax(src, dst):
  """Converts a native checkpoint to Trax's `Loop` layout; returns the .pkl.gz."""
  ckpt = native.load_native(src, shape_dtype_factory=_shape_dtype())
  trees, meta = ckpt.trees, ckpt.metadata
  if 'weights' not in trees:
    raise CheckpointFormatError(
        f'{src} has no "weights" tree; trees: {sorted(trees)}.')
  state = tree_leaves(trees.get('state', ()))
  eval_state = tree_leaves(trees['eval_state']) if 'eval_state' in trees else (
      state)
  slots = [[x for x in tree_leaves(s) if x is not None]
           for s in trees.get('trax_slots', trees.get('slots', []))]
  step = meta.get('step')
  if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
    raise CheckpointFormatError(f'{src}: step {step!r:.40} is not an int.')
  return trax_format.write_trax_loop_checkpoint(
      dst, 0 if step is None else step, tree_leaves(trees['weights']), state,
      eval_state, meta.get('history') or {}, slots,
      trees.get('input_signature'))


def _not_a_checkpoint(src):
  """The error for directory `src`, which holds no checkpoint itself (a run
  directory, say): what convert takes, and the run's newest checkpoint."""
  names = sorted(os.listdir(src))
  native_dirs = [n for n in names
                 if native.is_native_checkpoint(os.path.join(src, n))]
  trax_files = [n for n in names if n.endswith('.pkl.gz')]
  newest = max(native_dirs, key=lambda n: (n.rsplit('_', 1)[-1], n),
               default=None)
  picks = [os.path.join(src, n) for n in [newest] + trax_files[:1] if n]
  what = ('a retrax run directory' if run_layout.CONFIG_FILE in names else
          'a directory but not a native checkpoint')
  fix = (f'; in it: {" or ".join(picks)} (e.g. retrax convert {picks[0]} '
         'OUT)' if picks else '')
  return CheckpointFormatError(
      f'{src} is {what}; convert takes one checkpoint: a native checkpoint '
      f'directory (ckpt_* or model_* in a run), a Trax .pkl.gz file or a '
      f'Hugging Face model directory (config.json and weights){fix}.')


def checked_paths(src, dst):
  """`(src, dst)` as local paths, `src` existing: what every `retrax
  convert` checks first (here and in `retrax.app.hf_runs.convert`)."""
  src = local_paths.check_local(os.fspath(src), 'convert: source')
  dst = local_paths.check_local(os.fspath(dst), 'convert: destination')
  if not os.path.exists(src):
    raise FileNotFoundError(
        f'no checkpoint at {src}.{local_paths.missing_hint(src)}')
  return src, dst


def convert(src, dst, to=None, force=False):
  """Converts `src` into the other format (or `to`), written at `dst`.

  Args:
    src: a Trax checkpoint file or a native checkpoint directory.
    dst: the native directory, or the Trax basename (`.pkl.gz` optional).
    to: 'native' or 'trax'; by default the format `src` is not in.
    force: write even where files exist, replacing only those it writes.

  Returns:
    The path written (native directory or `.pkl.gz` file).

  Raises:
    CheckpointFormatError: `src` is not a checkpoint; a Hugging Face
      directory (or `to='hf'`) is `retrax.app.hf_runs.convert`'s.
  """
  src, dst = checked_paths(src, dst)
  if to == 'hf' or hf_files.is_hf_directory(src):
    # Those conversions build models and runs, above this package.
    raise CheckpointFormatError(
        f'{src}: Hugging Face conversions are retrax.app.hf_runs.convert\'s (or '
        'run retrax convert).')
  source = 'native' if native.is_native_checkpoint(src) else 'trax'
  if source == 'trax' and os.path.isdir(src):
    if os.path.isfile(os.path.join(src, hf_files.HF_CONFIG)):
      hf_files.check_weights_present(src)  # HF's config.json, no weights.
    raise _not_a_checkpoint(src)
  to = to or ('trax' if source == 'native' else 'native')
  if to not in FORMATS:
    raise ArgumentValueError(f'to must be one of {FORMATS}; got {to!r}.')
  if to == source:
    raise ArgumentValueError(f'{src} is already a {source} checkpoint.')
  target = check_destination(dst, to, force)
  with malformed_is_format_error(src):
    if to == 'native':
      return trax_to_native(src, target)
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    return native_to_trax(src, target)
