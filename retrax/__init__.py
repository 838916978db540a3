"""retrax: Trax's programming model, reversible layers and the Reformer, on today's JAX.

`import retrax as trax` and `from retrax import layers as tl` give Trax's names.
"""

from retrax import fastmath as fastmath
from retrax import layers as layers
from retrax import shapes as shapes

__version__ = '0.1.0'
