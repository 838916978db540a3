"""tl.Accelerate and the device helpers, on one device and on 4 forced host devices."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import shapes
from tests import multiprocess_env

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def _dense(x, d_out=3):
  layer = tl.Dense(d_out)
  layer.init(shapes.signature(x))
  return layer


def test_accelerate_one_device_equals_layer():
  x = np.random.RandomState(0).normal(size=(5, 4)).astype(np.float32)
  layer = _dense(x)
  w, b = (np.asarray(a) for a in layer.weights)
  fast = tl.Accelerate(layer, n_devices=1)
  np.testing.assert_allclose(fast(x), x @ w + b, rtol=1e-5, atol=1e-6)
  assert str(fast) == 'Accelerate[\n  Dense_3\n]'
  cpu = tl.Accelerate(layer, n_devices=0)  # 0: compiled for the CPU
  np.testing.assert_allclose(cpu(x), x @ w + b, rtol=1e-5, atol=1e-6)


def test_accelerate_tuple_inputs_and_replicate_weights():
  model = tl.Serial(tl.Dense(2), tl.Add())
  fast = tl.Accelerate(model, n_devices=1)
  x = (np.ones((3, 4), np.float32), np.full((3, 2), 10., np.float32))
  fast.init(shapes.signature(x))
  w = np.arange(8, dtype=np.float32).reshape(4, 2)
  fast.replicate_weights(((w, np.zeros(2, np.float32)), ()))
  np.testing.assert_allclose(fast(x), np.ones((3, 4)) @ w + 10.)
  np.testing.assert_array_equal(model.sublayers[0].weights[0], w)


def test_accelerate_weighted_accuracy_from_inputs_list():
  layer = tl.Accelerate(tl.WeightedCategoryAccuracy(), n_devices=1)
  logits = np.array([[.2, .1, .7, 0.]] * 4, np.float32)
  acc = layer([logits, np.array([0, 1, 2, 3]), np.array([1., 1., 1., 0.])])
  np.testing.assert_allclose(acc, 1 / 3, rtol=1e-6)


def test_reshape_by_device_and_for_n_devices():
  x = {'a': np.arange(12).reshape(6, 2), 'b': (np.arange(6),)}
  r = tl.reshape_by_device(x, 3)
  assert r['a'].shape == (3, 2, 2) and r['b'][0].shape == (3, 2)
  np.testing.assert_array_equal(r['a'][1], [[4, 5], [6, 7]])
  assert isinstance(tl.reshape_by_device(x, 2, pure_np=True)['a'], np.ndarray)
  with pytest.raises(ValueError, match=r'\(4\) does not evenly divide batch '
                     r'size \(6\)'):
    tl.reshape_by_device(x, 4)
  assert tl.for_n_devices(x, 1) is x
  rep = tl.for_n_devices(np.arange(3.), 2)  # more copies than devices here
  np.testing.assert_array_equal(rep, [[0., 1., 2.]] * 2)


def test_shard_and_unshard_split_rank_lt3_on_axis0_else_last():
  n_local = fastmath.local_device_count()
  a, c = np.arange(8.).reshape(4, 2), np.arange(24.).reshape(2, 3, 4)
  sa, sc = tl.shard((a, c), 1)
  assert sa.shape == (n_local, 4, 2) and sc.shape == (n_local, 2, 3, 4)
  ua, uc = tl.unshard((sa, sc), 1)
  np.testing.assert_array_equal(ua, a)
  np.testing.assert_array_equal(uc, c)
  with pytest.raises(ValueError, match='into 3 shards'):
    tl.shard(a, 3)


def test_on_cpu_and_on_accelerator():
  import jax
  x = np.ones(3, np.float32)
  y = tl.on_cpu(x)
  assert y.devices() == {jax.devices('cpu')[0]}
  np.testing.assert_array_equal(tl.on_accelerator(y), x)


def test_jit_forward_means_over_devices_only_when_asked():
  def forward(x, weights, state, rng):
    del rng
    return x * weights, state
  f = tl.jit_forward(forward, 1)
  y, s = f(np.arange(4.), 2., (), fastmath.random.get_prng(0))
  np.testing.assert_array_equal(y, [0., 2., 4., 6.])
  assert s == ()
  assert np.asarray(tl.mean_or_pmean(1, np.arange(4.))) == 1.5


_MULTI = textwrap.dedent('''
    import numpy as np
    from retrax import fastmath, layers as tl, shapes
    from retrax.layers import base
    assert fastmath.local_device_count() == 4
    x = np.random.RandomState(1).normal(size=(6, 5)).astype(np.float32)
    layer = tl.Serial(tl.Dense(3), tl.Relu(), tl.Dense(2))
    layer.init(shapes.signature(x))
    want = np.asarray(layer(x))
    fast = tl.Accelerate(layer)
    got = fast(x)  # 6 rows over 4 devices: padded to 8
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    w = fast.weights[0][0]
    assert w.shape == (4, 5, 3) and len(w.sharding.device_set) == 4
    y = tl.jit_forward(lambda x, w, s, r: (x.sum(axis=-1), s), 4)(
        np.ones((8, 2)), tl.for_n_devices(np.zeros(1), 4), (),
        fastmath.random.get_prng(0))[0]
    np.testing.assert_array_equal(y, [2.] * 2)  # mean over the devices
    base.N_WEIGHTS_SHARDS = 2  # each weight split in 2 on axis 0 (rank < 3)
    x4 = x[:, :4]
    layer2 = tl.Serial(tl.Dense(4), tl.Relu(), tl.Dense(2))
    layer2.init(shapes.signature(x4))
    want2 = np.asarray(layer2(x4))
    sharded = tl.Accelerate(layer2)
    w1 = sharded.weights[0][0]
    assert w1.shape == (4, 2, 4)  # device i holds half i % 2 of W (4, 4)
    np.testing.assert_array_equal(w1[2], np.asarray(layer2.weights[0][0])[:2])
    np.testing.assert_allclose(sharded(x4), want2, rtol=1e-5, atol=1e-6)
    base.N_WEIGHTS_SHARDS = 1
    parts = tl.shard(np.arange(8.).reshape(4, 2), 2)
    np.testing.assert_array_equal(parts[:, 0, 0], [0., 4., 0., 4.])
    np.testing.assert_array_equal(tl.unshard(parts, 2),
                                  np.arange(8.).reshape(4, 2))
    print('OK')
''')


def test_accelerate_on_four_host_devices():
  env = dict(os.environ,
             XLA_FLAGS=multiprocess_env.xla_flags(4),
             JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get('PYTHONPATH',
                                                               '')]))
  proc = subprocess.run([sys.executable, '-c', _MULTI], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-2000:] + proc.stderr[-4000:])
