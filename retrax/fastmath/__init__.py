"""Fast math on JAX under Trax's `fastmath` names; `use_backend('numpy')` for eager debugging."""

from retrax.fastmath import random
from retrax.fastmath.backend import Backend
from retrax.fastmath.backend import backend
from retrax.fastmath.backend import backend_name
from retrax.fastmath.backend import is_backend
from retrax.fastmath.backend import numpy
from retrax.fastmath.backend import set_backend
from retrax.fastmath.backend import use_backend
from retrax.fastmath.ops import *  # noqa: F401,F403  (the op list of trax.fastmath)
from retrax.fastmath.tree import nested_map
from retrax.fastmath.tree import nested_map_multiarg
from retrax.fastmath.tree import nested_stack
from retrax.fastmath.tree import nested_zip
from retrax.fastmath.tree import tree_flatten
from retrax.fastmath.tree import tree_leaves
from retrax.fastmath.tree import tree_unflatten
