"""fastmath: backend switching, ops vs NumPy references, PRNG, tree utils.

The NumPy backend runs layers eagerly.
"""

import collections
import importlib
import math
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import fastmath
from retrax import shapes
from retrax.layers import activation_fns as af
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import normalization as norm
from retrax.shapes import ShapeDtype

_NT = collections.namedtuple('_NT', ['x'])


# --- backends -------------------------------------------------------------------


def test_default_backend_is_jax():
  assert fastmath.backend_name() == 'jax'
  assert fastmath.is_backend(fastmath.Backend.JAX)
  assert fastmath.backend()['np'] is jnp
  assert fastmath.numpy.isinf is jnp.isinf


def test_use_backend_switches_and_restores():
  with fastmath.use_backend('numpy'):
    assert fastmath.backend_name() == 'numpy'
    assert fastmath.is_backend(fastmath.Backend.NUMPY)
    assert fastmath.backend()['np'] is np
    assert fastmath.numpy.isinf is np.isinf
    assert fastmath.numpy.bfloat16 is jnp.bfloat16  # NumPy has none
  assert fastmath.backend_name() == 'jax'
  with pytest.raises(RuntimeError):
    with fastmath.use_backend(fastmath.Backend.NUMPY):
      raise RuntimeError('boom')
  assert fastmath.backend_name() == 'jax'


def test_fastmath_numpy_is_an_importable_module_that_follows_the_backend():
  # Trax has a module trax/fastmath/numpy.py: `import trax.fastmath.numpy as
  # np` binds jax.numpy's names, NumPy's under the numpy backend.
  fnp = importlib.import_module('retrax.fastmath.numpy')
  assert fnp is fastmath.numpy is sys.modules['retrax.fastmath.numpy']
  assert fnp.zeros is jnp.zeros and fnp.float32 is jnp.float32
  with fastmath.use_backend('numpy'):
    assert fnp.zeros is np.zeros
  assert 'einsum' in dir(fnp)
  # The tree functions Trax's module defines, importable by name from it.
  from retrax.fastmath.numpy import nested_map
  assert nested_map is fastmath.nested_map
  # Not a package: `fnp.__path__` would let `import retrax.fastmath.numpy.X`
  # reach into jax.numpy.
  assert not hasattr(fnp, '__path__')
  with pytest.raises(AttributeError):
    fnp.not_a_numpy_name  # noqa: B018


_COMPAT_FASTMATH_NUMPY = textwrap.dedent('''
    from retrax import compat
    compat.install()
    import trax.fastmath.numpy as np
    from trax import fastmath
    import jax.numpy as jnp
    assert np.zeros is jnp.zeros and fastmath.numpy.ones is jnp.ones
    assert float(np.sum(np.arange(4.))) == 6.
    print('OK')
''')


def test_trax_fastmath_numpy_imports_under_compat():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=os.pathsep.join(
      [root, os.environ.get('PYTHONPATH', '')]))
  proc = subprocess.run([sys.executable, '-c', _COMPAT_FASTMATH_NUMPY],
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-2000:] + proc.stderr[-4000:])


def test_set_backend_and_reset():
  try:
    fastmath.set_backend('numpy')
    assert fastmath.backend_name() == 'numpy'
    with fastmath.use_backend('jax'):
      assert fastmath.backend_name() == 'jax'
    assert fastmath.backend_name() == 'numpy'
  finally:
    fastmath.set_backend(None)
  assert fastmath.backend_name() == 'jax'


def test_unknown_backend_is_rejected():
  with pytest.raises(ValueError, match="No backend with name 'torch'"):
    with fastmath.use_backend('torch'):
      pass


def test_tensorflow_numpy_keeps_its_name_and_computes_with_jax():
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    with fastmath.use_backend('tensorflow-numpy'):
      assert fastmath.backend_name() == 'tensorflow-numpy'
      assert fastmath.is_backend(fastmath.Backend.TFNP)
      assert fastmath.numpy.exp is jnp.exp
      y = af.Tanh()(np.array([0., 1.], np.float32))
      assert isinstance(y, jax.Array)


def test_numpy_backend_runs_layers_eagerly_on_numpy():
  x = np.random.RandomState(0).randn(4, 5).astype(np.float32)
  key = jax.random.PRNGKey(0)

  def make():
    return cb.Serial(core.Dense(6), af.Relu(), core.Dropout(0.5),
                     norm.LayerNorm(), core.Dense(3), core.LogSoftmax(),
                     af.Gelu(), af.Sigmoid())

  jax_model = make()
  jax_model.init(shapes.signature(x), rng=key)
  y_jax = jax_model(x, rng=key)
  with fastmath.use_backend('numpy'):
    model = make()
    weights, _ = model.init(shapes.signature(x), rng=fastmath.random.get_prng(0))
    for w in jax.tree_util.tree_leaves(weights):
      assert isinstance(w, np.ndarray)
    pure_fn = model.pure_fn
    assert fastmath.jit(pure_fn) is pure_fn  # no compilation
    y = model(x, rng=fastmath.random.get_prng(0))
    assert type(y) is np.ndarray and y.dtype == np.float32
    assert model.output_signature(shapes.signature(x)) == ShapeDtype((4, 3))
  # The same key gives the same weights and dropout mask as on JAX.
  np.testing.assert_allclose(y, y_jax, rtol=1e-5, atol=1e-6)


def test_numpy_backend_scan_cond_and_batch_norm_state():
  def add_with_carry(x, carry):
    return x + carry, x + carry
  layer = cb.Scan(core.base.Fn('AddWithCarry', add_with_carry, n_out=2))
  xs = [np.array([[0, 1], [10, 20], [100, 200]]), np.array([5, 6])]
  with fastmath.use_backend('numpy'):
    ys, carry = layer(xs)
    assert isinstance(ys, np.ndarray)
    assert ys.tolist() == [[5, 7], [15, 27], [115, 227]]
    assert carry.tolist() == [115, 227]
    bn = norm.BatchNorm(axis=(0,))
    bn.init(ShapeDtype((4, 2)))
    bn(np.arange(8, dtype=np.float32).reshape(4, 2))
    assert int(bn.state[2]) == 1 and isinstance(bn.state[0], np.ndarray)


# --- ops -----------------------------------------------------------------------------


@pytest.mark.parametrize('backend', ['jax', 'numpy'])
def test_logsumexp_expit_erf_match_references(backend):
  x = np.array([[1., 2., 3.], [-np.inf, 0., -np.inf], [1000., 1000., 0.]],
               np.float32)
  with fastmath.use_backend(backend):
    lse = np.asarray(fastmath.logsumexp(x, axis=-1))
    lse_keep = fastmath.logsumexp(x, axis=0, keepdims=True)
    sig = np.asarray(fastmath.expit(np.array([-2., 0., 3.], np.float32)))
    erf = np.asarray(fastmath.erf(np.array([-1., 0., .5], np.float32)))
  np.testing.assert_allclose(
      lse, [math.log(math.exp(1) + math.exp(2) + math.exp(3)), 0.,
            1000. + math.log(2.)], rtol=1e-6)
  assert lse_keep.shape == (1, 3)
  np.testing.assert_allclose(sig, [1 / (1 + math.exp(2)), .5,
                                   1 / (1 + math.exp(-3))], rtol=1e-6)
  np.testing.assert_allclose(erf, [math.erf(-1.), 0., math.erf(.5)], rtol=1e-6)


def test_stop_gradient_and_custom_gradients():
  g = jax.grad(lambda x: fastmath.stop_gradient(x) * x)(3.)
  assert float(g) == 3.
  with fastmath.use_backend('numpy'):
    assert fastmath.stop_gradient(5.) == 5.

  def f_vjp(x):
    return x ** 2, lambda ct: (ct * 10.,)
  f = fastmath.custom_grad(f_vjp, lambda x: x ** 2)
  assert float(f(3.)) == 9. and float(jax.grad(f)(3.)) == 10.
  h = fastmath.custom_vjp(lambda x: jnp.sin(x),
                          lambda x: (jnp.sin(x), x),
                          lambda x, ct: (ct * 7.,))
  assert float(jax.grad(h)(0.3)) == 7.


@pytest.mark.parametrize('backend', ['jax', 'numpy'])
def test_fori_loop_scan_cond(backend):
  with fastmath.use_backend(backend):
    assert int(fastmath.fori_loop(2, 5, lambda i, x: x + i, 1)) == 10
    carry, ys = fastmath.scan(lambda c, x: (c + x, c * x), 1,
                              np.array([1, 2, 3]))
    assert int(carry) == 7 and np.asarray(ys).tolist() == [1, 4, 12]
    carry, ys = fastmath.scan(lambda c, x: (c + x, c), 0, np.array([1, 2, 3]),
                              reverse=True)
    assert int(carry) == 6 and np.asarray(ys).tolist() == [5, 3, 0]
    pick = fastmath.cond(np.array(True), lambda a: a + 1, lambda a: a - 1, 5)
    assert int(pick) == 6
    pick = fastmath.cond(np.array(False), lambda a: a + 1, lambda a: a - 1, 5)
    assert int(pick) == 4


def test_index_and_dynamic_slice_ops():
  x = np.arange(6.).reshape(2, 3)
  np.testing.assert_array_equal(fastmath.index_update(x, (0, 1), 9.),
                                [[0, 9, 2], [3, 4, 5]])
  np.testing.assert_array_equal(fastmath.index_add(x, (1, 0), 10.),
                                [[0, 1, 2], [13, 4, 5]])
  np.testing.assert_array_equal(fastmath.index_min(x, (0, 2), -1.),
                                [[0, 1, -1], [3, 4, 5]])
  np.testing.assert_array_equal(fastmath.index_max(x, (0, 0), 7.),
                                [[7, 1, 2], [3, 4, 5]])
  np.testing.assert_array_equal(fastmath.dynamic_slice(x, (1, 1), (1, 2)),
                                [[4, 5]])
  np.testing.assert_array_equal(fastmath.dynamic_slice_in_dim(x, 1, 2, axis=1),
                                [[1, 2], [4, 5]])
  np.testing.assert_array_equal(
      fastmath.dynamic_update_slice_in_dim(x, np.array([[8.], [9.]]), 2, 1),
      [[0, 1, 8], [3, 4, 9]])
  vals, idx = fastmath.top_k(np.array([3., 1., 4., 1., 5.]), 2)
  assert vals.tolist() == [5., 4.] and idx.tolist() == [4, 2]
  keys, values = fastmath.sort_key_val(np.array([3, 1, 2]),
                                       np.array([30, 10, 20]))
  assert keys.tolist() == [1, 2, 3] and values.tolist() == [10, 20, 30]


def test_pools_match_numpy():
  x = np.random.RandomState(0).randn(2, 4, 6, 3).astype(np.float32)
  windows = x.reshape(2, 2, 2, 3, 2, 3)  # 2x2 windows, stride 2
  np.testing.assert_allclose(fastmath.max_pool(x, (2, 2), None, 'VALID'),
                             windows.max(axis=(2, 4)), rtol=1e-6)
  np.testing.assert_allclose(fastmath.sum_pool(x, (2, 2), None, 'VALID'),
                             windows.sum(axis=(2, 4)), rtol=1e-5)
  np.testing.assert_allclose(fastmath.avg_pool(x, (2, 2), None, 'VALID'),
                             windows.mean(axis=(2, 4)), rtol=1e-5)


def test_conv_matches_numpy_correlation():
  x = np.random.RandomState(0).randn(1, 5, 3).astype(np.float32)  # N W C
  k = np.random.RandomState(1).randn(2, 3, 4).astype(np.float32)  # W I O
  y = fastmath.conv(x, k, (1,), 'VALID', ('NWC', 'WIO', 'NWC'))
  ref = np.stack([np.einsum('wi,wio->o', x[0, t:t + 2], k) for t in range(4)])
  np.testing.assert_allclose(y[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('backend', ['jax', 'numpy'])
def test_abstract_eval(backend):
  def f(a, b):
    return a @ b, (a.sum(), b.astype(np.int32))
  with fastmath.use_backend(backend):
    out = fastmath.abstract_eval(f)(ShapeDtype((2, 3)), ShapeDtype((3, 4)))
  assert out == (ShapeDtype((2, 4)),
                 (ShapeDtype((), np.float32), ShapeDtype((3, 4), np.int32)))


def test_device_counts_and_dataset_as_numpy():
  assert fastmath.global_device_count() == jax.device_count() >= 1
  assert fastmath.local_device_count() == jax.local_device_count()
  assert fastmath.device_count() == jax.device_count()
  batches = list(fastmath.dataset_as_numpy([(jnp.ones(2), {'y': jnp.zeros(1)})]))
  assert isinstance(batches[0][0], np.ndarray)
  assert isinstance(batches[0][1]['y'], np.ndarray)


# --- random ------------------------------------------------------------------


def test_prng_keys_and_determinism():
  key = fastmath.random.get_prng(42)
  np.testing.assert_array_equal(key, jax.random.PRNGKey(42))
  a = fastmath.random.uniform(key, (3,), jnp.float32, -1., 1.)
  np.testing.assert_array_equal(a, fastmath.random.uniform(key, (3,),
                                                           jnp.float32, -1., 1.))
  k1, k2 = fastmath.random.split(key)
  assert not np.array_equal(fastmath.random.normal(k1, (3,)),
                            fastmath.random.normal(k2, (3,)))
  with pytest.raises(TypeError, match='scalar'):
    fastmath.random.get_prng(np.array([1, 2]))
  with fastmath.use_backend('numpy'):
    key_np = fastmath.random.get_prng(42)
    b = fastmath.random.uniform(key_np, (3,), jnp.float32, -1., 1.)
    assert isinstance(key_np, np.ndarray) and isinstance(b, np.ndarray)
    bern = fastmath.random.bernoulli(fastmath.random.fold_in(key_np, 3), 0.5,
                                     (4,))
    assert isinstance(bern, np.ndarray)
  np.testing.assert_array_equal(a, b)


# --- tree utils -----------------------------------------------------------------


def test_nested_map():
  inp = {'a': ([0, 1], 2), 'b': _NT(3)}
  assert fastmath.nested_map(lambda x: x + 1, inp) == {'a': ([1, 2], 3),
                                                      'b': _NT(4)}
  assert fastmath.nested_map(lambda x: x + 1, (None, [None, 2])) == (
      None, [None, 3])
  assert fastmath.nested_map(sum, ([None, None], [1, 2]), level=1) == (None, 3)
  assert fastmath.nested_map(str, (None, 1), ignore_nones=False) == ('None', '1')
  assert fastmath.nested_map(sum, ([1, 2], [(3, 4), (5,)]), level=1) == (
      3, [7, 5])


def test_nested_map_multiarg_and_zip_and_stack():
  assert fastmath.nested_map_multiarg(
      lambda a, b: a * b, {'x': (1, [2])}, {'x': (3, [4])}) == {'x': (3, [8])}
  with pytest.raises(ValueError, match='differ in structure'):
    fastmath.nested_map_multiarg(lambda a, b: a, (1, 2), (1,))
  assert fastmath.nested_zip([(1, [2]), (3, [4])]) == [(1, 3), [(2, 4)]]
  inp = [{'a': ([0, 1], 2), 'b': _NT(3)}, {'a': ([1, 2], 3), 'b': _NT(4)}]
  out = fastmath.nested_stack(inp)
  np.testing.assert_equal(out, {'a': ([[0, 1], [1, 2]], [2, 3]),
                                'b': _NT([3, 4])})
  assert isinstance(out['b'], _NT)


def test_tree_flatten_leaves_unflatten():
  tree = ((), (np.zeros(1), {'k': 2}), [None, 3])
  assert len(fastmath.tree_flatten(tree)) == 4
  assert fastmath.tree_leaves(tree)[1:] == [2, 3]
  assert fastmath.tree_leaves(tree, ignore_nones=False)[2] is None
  new, rest = fastmath.tree_unflatten(['a', 'b', 'c', 'd', 'e'],
                                      ((), ('x', {'k': 'y'}), ['z', 'w']),
                                      copy_from_tree=[()])
  assert new == ((), ('a', {'k': 'b'}), ['c', 'd']) and rest == ['e']
  with pytest.raises(ValueError, match='ran out'):
    fastmath.tree_unflatten([], ('x',))
