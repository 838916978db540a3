"""Named meshes and FSDP: 8 forced host devices (in a subprocess) against one device."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from retrax.supervised import sharding
from tests import multiprocess_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def run_worker(script, *args, n_devices=8, timeout=900):
  """Runs `script` (in this folder) on `n_devices` forced host devices."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=multiprocess_env.xla_flags(n_devices))
  env['PYTHONPATH'] = os.pathsep.join([_HERE, _ROOT, env.get('PYTHONPATH', '')])
  proc = subprocess.run([sys.executable, os.path.join(_HERE, script), *args],
                        env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-3000:] + proc.stderr[-5000:])
  return proc.stdout


@pytest.mark.slow
def test_fsdp_mesh_trains_to_one_device_losses_on_a_quarter_per_device(
    tmp_path):
  result = str(tmp_path / 'mesh.json')
  out = run_worker('mesh_worker.py', result)
  with open(result) as f:
    got = json.load(f)
  # Train losses of steps 1-4, then eval losses: the 1-device run's.
  np.testing.assert_allclose(got['mesh'], got['one'], rtol=1e-5)
  assert got['per_device'] <= 0.3 * got['total'], got
  assert got['weights_max_diff'] < 1e-4
  line = [l for l in out.splitlines() if l.startswith('Weights+slots')][0]
  assert 'per device of' in line and 'mesh data=2,fsdp=4' in line, line


@pytest.mark.parametrize('shape,n,want', [
    ((32, 64), 4, (None, 'fsdp')),       # The largest axis that 4 divides.
    ((64, 30), 4, ('fsdp',)),
    ((30, 6), 4, ()),                    # None divides: replicated.
    ((), 4, ()),
    ((8, 8), 1, ()),
])
def test_fsdp_spec_picks_the_largest_divisible_axis(shape, n, want):
  assert tuple(sharding.fsdp_spec(shape, n)) == want


@pytest.mark.parametrize('spec,message', [
    ('data=2,model=4', "axis 'model' is unknown"),
    ('data=2,data=4', 'is unknown or repeated'),
    ('fsdp=0', 'must be a positive integer'),
    ('fsdp', 'expected axis=size pairs'),
    ('data=3', 'needs 3 devices; this run has 1'),
])
def test_bad_meshes_are_one_line_errors(spec, message):
  with pytest.raises(sharding.MeshError, match=message) as info:
    sharding.build_mesh(spec)
  assert '\n' not in str(info.value)


def test_parse_mesh():
  assert sharding.parse_mesh('data=2, fsdp=4') == {'data': 2, 'fsdp': 4}
  assert sharding.parse_mesh({'fsdp': 8}) == {'fsdp': 8}


@pytest.mark.slow
def test_checkpoints_move_between_a_mesh_and_one_device_exactly(tmp_path):
  # The worker checks every restored array against the saved run's, both ways
  # (data=2,fsdp=4 on 8 devices -> 1 device, and 1 -> 8), then a step of each.
  run_worker('mesh_worker.py', '--checkpoints', str(tmp_path))


def test_weights_shards_mesh_is_trax_n_weights_shards():
  assert sharding.weights_shards_mesh(1) is None
  with pytest.raises(sharding.MeshError, match='must divide the 1 device'):
    sharding.weights_shards_mesh(2)
  with pytest.raises(sharding.MeshError, match='positive int'):
    sharding.weights_shards_mesh(0)


def test_stacked_layers_split_over_processes_save_their_layers(tmp_path):
  """Weights stacked over layers and split over 2 (fake) processes, on a
  feature axis and on the layer axis, load back as the per-layer arrays."""
  from retrax.checkpoints import native
  from retrax.layers import stacked
  rng = np.random.default_rng(0)
  layers = tuple((rng.normal(size=(4, 6)).astype(np.float32),
                  rng.normal(size=(3,)).astype(np.float32)) for _ in range(4))
  groups = stacked.stack_layers(layers, 2).groups  # Leaves (2, 4, 6), (2, 3).

  def split(x, p):
    """Process `p`'s half: (2, 4, 6) by columns, (2, 3) by layer rows."""
    if x.ndim == 3:
      index = (slice(None), slice(None), slice(3 * p, 3 * p + 3))
    else:
      index = (slice(p, p + 1), slice(None))
    return native.Shards(x.shape, x.dtype, [(index, x[index])])

  path = str(tmp_path / 'c')
  for p in (1, 0):
    tree = stacked.StackedLayers(
        [jax.tree_util.tree_map(lambda x, p=p: split(x, p), g)
         for g in groups], 4)
    native.save_native_sharded(
        path, {'weights': sharding._unstacked((tree,))}, {}, process_index=p,
        process_count=2, token='0123456789abcdef',
        all_ok=lambda ok: [True, True])
  (got,) = native.load_native(path).trees['weights']
  assert len(got) == 4
  for want, have in zip(layers, got):
    for w, h in zip(want, have):
      np.testing.assert_array_equal(h, w)
