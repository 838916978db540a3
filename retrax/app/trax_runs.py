"""`retrax convert TRAX_RUN OUT`: a run directory of Trax's trainer becomes a retrax run.

`python -m trax.trainer` leaves in its output directory Trax's checkpoint
(`model.pkl.gz`, with `model.weights.npy.gz` and slots beside it for a
`Loop`'s) and `config.gin`, the bindings it trained with. OUT gets what
every retrax run holds (`retrax.run_layout`): `model.json` (the model
`train.model` builds under those bindings), `model_<step>` (the checkpoint,
as `retrax convert FILE.pkl.gz` writes it) and a copy of `config.gin` (the
run's data, for `retrax eval` and `sample`). Reading config.gin runs its
imports, as training did: convert only runs you trust.
"""

import os

from retrax.checkpoints import convert as ckpt_convert
from retrax.checkpoints import destination
from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints.errors import malformed_is_format_error
from retrax.models import registry
from retrax.run_layout import GIN_CONFIG_FILE
from retrax.runs import data as run_data
from retrax.supervised import checkpointing


def is_trax_run(path):
  """Whether `path` is a directory holding Trax's checkpoint and config.gin."""
  return (os.path.isdir(path) and
          checkpointing.trax_checkpoint_path(path) is not None and
          os.path.isfile(os.path.join(path, GIN_CONFIG_FILE)))


def convert(src, dst, to=None, force=False):
  """Converts Trax run directory `src` into retrax run directory `dst`.

  Returns:
    `dst`.
  """
  src, dst = ckpt_convert.checked_paths(src, dst)
  if to not in (None, 'native'):
    raise run_data.RunDataError(
        f'{src} is a run directory of Trax\'s trainer; convert makes it a '
        'retrax run (leave out --to), which retrax convert can then write in '
        'another format.')
  config = os.path.join(src, GIN_CONFIG_FILE)
  gin = run_data.parse_gin_file(config)
  build = run_data.gin_configured(gin, config, 'train.model')
  if build is None:
    raise run_data.RunDataError(f'{config} binds no train.model.')
  model = build(mode='eval')  # Records its constructor, gin's bindings too.
  if registry.constructor_of(model) is None:
    raise run_data.RunDataError(
        f'{config}: train.model builds a model with no model.json form (not a '
        'retrax.models constructor with JSON arguments).')
  checkpoint = checkpointing.trax_checkpoint_path(src)
  step = checkpointing.trax_file_step(checkpoint)
  if step is None:
    raise run_data.RunDataError(f'{checkpoint} records no training step.')
  destination.check_destination(dst, 'native', force)
  os.makedirs(dst, exist_ok=True)
  with malformed_is_format_error(checkpoint):
    ckpt_convert.trax_to_native(checkpoint,
                                checkpointing.permanent_path(dst, step))
  registry.write_model_file(dst, model)
  with open(config, 'rb') as f, atomic_write(
      os.path.join(dst, GIN_CONFIG_FILE)) as out:
    out.write(f.read())
  return dst
