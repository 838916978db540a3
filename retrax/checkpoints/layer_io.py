"""`Layer.init_from_file` / `Layer.save_to_file`: checkpoint files <-> a layer.

Works on any object with Trax's layer interface: `init(signature)`,
`weights_and_state_signature(signature)`, `n_in`, and settable `weights` and
`state`.
"""

import os

from retrax import local_paths
from retrax.checkpoints import native
from retrax.checkpoints import trax_format
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import CheckpointNotFoundError
from retrax.checkpoints.tree import flatten_weights_and_state
from retrax.checkpoints.tree import tree_leaves
from retrax.checkpoints.tree import unflatten_weights_and_state
from retrax.shapes import ShapeDtype


def _shape_dtype_factory():
  return ShapeDtype


def read_flat_checkpoint(file_name):
  """`(flat_weights, flat_state, input_signature)` from a Trax or native file."""
  if native.is_native_checkpoint(file_name):
    ckpt = native.load_native(file_name,
                              shape_dtype_factory=_shape_dtype_factory())
    if 'weights' not in ckpt.trees:
      raise CheckpointFormatError(
          f'{file_name}: native checkpoint has no "weights" tree (trees: '
          f'{sorted(ckpt.trees)}).')
    state = ckpt.trees.get('state')
    return (tree_leaves(ckpt.trees['weights']),
            None if state is None else tree_leaves(state),
            ckpt.trees.get('input_signature'))
  d = trax_format.read_trax_checkpoint(
      file_name, shape_dtype_factory=_shape_dtype_factory(), with_slots=False)
  return d['flat_weights'], d['flat_state'], d['input_signature']


def _model_inputs(signature, n_in):
  """Trims a stored batch signature (inputs, targets, ...) to the model's inputs."""
  if isinstance(signature, (list, tuple)) and len(signature) > n_in >= 1:
    return tuple(signature[:n_in])
  return signature


def init_layer_from_file(layer, file_name, weights_only=False,
                         input_signature=None):
  """Sets `layer`'s weights (and state) from a checkpoint; returns them.

  With `weights_only=True` the layer is first initialized from the signature
  (so its state is fresh, as predict-mode models need) and only the weights
  are replaced. Leaf counts and shapes are checked against the layer's own
  weight tree; a mismatch raises `TreeStructureError` naming the tree path.
  """
  file_name = local_paths.check_local(os.fspath(file_name), 'init_from_file')
  if not os.path.exists(file_name):
    raise CheckpointNotFoundError(
        f'init_from_file: no file {file_name!r}.'
        f'{local_paths.missing_hint(file_name)}')
  flat_weights, flat_state, stored_signature = read_flat_checkpoint(file_name)
  signature = input_signature
  if signature is None:
    signature = _model_inputs(stored_signature, layer.n_in)
  if signature is None:
    raise CheckpointFormatError(
        f'{file_name} records no input signature; pass input_signature=.')
  if flat_state is None and not weights_only:
    raise CheckpointFormatError(
        f'{file_name} holds weights only (no flat_state); call with '
        f'weights_only=True.')
  if weights_only:
    layer.init(signature)
  weights, state = unflatten_weights_and_state(
      flat_weights, flat_state, layer.weights_and_state_signature(signature),
      weights_only=weights_only)
  if not weights_only:
    layer.state = state
  layer.weights = weights
  return layer.weights, layer.state


def save_layer_to_file(layer, file_name, weights_only=False,
                       input_signature=None):
  """Writes `layer`'s weights (and state) in Trax's `save_to_file` layout."""
  flat_weights, flat_state = flatten_weights_and_state(layer.weights,
                                                       layer.state)
  trax_format.write_trax_layer_file(
      file_name, flat_weights, None if weights_only else flat_state,
      input_signature)
