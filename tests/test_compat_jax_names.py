"""retrax.compat restores the JAX names Trax-era code imports (in a fresh interpreter)."""

import os
import subprocess
import sys
import textwrap

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROGRAM = textwrap.dedent('''
    import jax
    import numpy as np
    assert not hasattr(jax, 'tree_map')  # plain `import retrax` adds nothing
    import retrax
    assert not hasattr(jax, 'tree_map')
    import retrax.compat
    retrax.compat.install()
    from jax.config import config
    config.update('jax_enable_x64', True)
    assert jax.numpy.ones(2, jax.numpy.float64).dtype == np.float64
    config.update('jax_enable_x64', False)
    from jax import test_util as test_util
    tree = {'a': [1, 2], 'b': (3,)}
    assert jax.tree_map(lambda x: x * 10, tree) == {'a': [10, 20], 'b': (30,)}
    assert jax.tree_multimap(lambda x, y: x + y, [1, 2], [3, 4]) == [4, 6]
    leaves, treedef = jax.tree_flatten(tree)
    assert leaves == [1, 2, 3] and jax.tree_leaves(tree) == leaves
    assert jax.tree_unflatten(treedef, [7, 8, 9]) == {'a': [7, 8], 'b': (9,)}
    assert jax.tree_structure(tree) == treedef
    x = jax.numpy.zeros(4)
    y = jax.ops.index_update(x, jax.ops.index[1:3], 5.)
    assert y.tolist() == [0., 5., 5., 0.]
    assert jax.ops.index_add(y, 1, 2.).tolist() == [0., 7., 5., 0.]
    assert jax.ops.index_mul(y, 1, 2.).tolist() == [0., 10., 5., 0.]
    assert jax.ops.index_min(y, 1, 1.).tolist() == [0., 1., 5., 0.]
    assert jax.ops.index_max(y, 0, 3.).tolist() == [3., 5., 5., 0.]
    rep = jax.device_put_replicated(np.arange(3.), jax.local_devices())
    assert rep.shape == (len(jax.local_devices()), 3)
    assert jax.ShapedArray((2,), np.float32).shape == (2,)
    assert jax.lax.tie_in(1, 2) == 2
    import trax.layers as tl
    assert tl.Accelerate is retrax.layers.Accelerate
    print('OK')
''')


def test_compat_restores_removed_jax_names_only_after_install():
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get('PYTHONPATH',
                                                               '')]))
  proc = subprocess.run([sys.executable, '-c', _PROGRAM], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-2000:] + proc.stderr[-4000:])
