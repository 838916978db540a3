"""`model.weights` is Trax 1.4.1's tree, as JAX sees it, for every shared model.

`tests/fixtures/weight_trees/weight_trees.json` was written by real Trax
(`make_weight_trees.py` beside it): for each model of `trax.models` that
`retrax.models` also has, at a tiny configuration, the leaves of
`jax.tree_util.tree_leaves(model.weights)` after `model.init(...)` and the
tree itself. Trax programs walk, index and replace `model.weights` with
these trees, so retrax must give the same, whatever it holds inside (e.g.
the stacked weights of a reversible stack).
"""

import json
import os

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.layers.stacked import StackedLayers
from tests.fixtures.weight_trees.tree_description import describe
from tests.fixtures.weight_trees.tree_description import leaf_name

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, 'fixtures',
                       'weight_trees', 'weight_trees.json')
with open(FIXTURE) as f:
  TRAX = json.load(f)


def build(name):
  kwargs, signature = TRAX[name]['kwargs'], TRAX[name]['signature']
  model = getattr(models, name)(**kwargs)
  sig = tuple(shapes.ShapeDtype(tuple(s), np.dtype(d)) for s, d in signature)
  model.init(sig[0] if len(sig) == 1 else sig)
  return model


# Models whose init alone takes seconds on a 2-core CPU (convolutions, many
# layers) and that hold no stacked reversible blocks, whose trees no layout
# of retrax's own replaces: run with the slow tests.
REVERSIBLE = {'ConfigurableTerraformer', 'Reformer', 'ReformerLM',
              'ReformerShortenLM'}
SLOW = {'AtariCnn', 'AtariCnnBody', 'BERT', 'FrameStackMLP', 'HourglassLM',
        'NeuralGPU', 'Resnet50', 'WideResnet'}


@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
    for name in sorted(TRAX)])
def test_weights_tree_is_trax(name):
  model = build(name)
  weights = model.weights
  got = [leaf_name(x) for x in jax.tree_util.tree_leaves(weights)]
  assert got == TRAX[name]['leaves']
  assert describe(weights) == TRAX[name]['tree']
  # The reversible models' builders declare their repeated blocks: each
  # reversible stack holds its weights stacked once.
  stacks = [layer for layer in model.walk()
            if isinstance(layer, tl.ReversibleSerial)]
  assert bool(stacks) == (name in REVERSIBLE)
  assert all(isinstance(layer.stacked_weights, StackedLayers)
             for layer in stacks)
