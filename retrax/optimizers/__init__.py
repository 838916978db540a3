"""Optimizers with Trax's names, arguments and update rules, built on optax.

Each optimizer follows Trax's interface (``tree_init`` / ``tree_update`` over a
model's weight tree, slots laid out like Trax's). Any
``optax.GradientTransformation`` is accepted wherever an optimizer is expected:
see :func:`as_optimizer` and :func:`from_optax`. ``Trainer`` runs one jitted
optimizer step of a model+loss layer; ``ReversibleSerialTrainer`` does the
same layer by layer, saving memory.
"""

from retrax.optimizers import adafactor as adafactor
from retrax.optimizers import adam as adam
from retrax.optimizers import base as base
from retrax.optimizers import momentum as momentum
from retrax.optimizers import optax_bridge as optax_bridge
from retrax.optimizers import placement as placement
from retrax.optimizers import reversible_trainer as reversible_trainer
from retrax.optimizers import rms_prop as rms_prop
from retrax.optimizers import sm3 as sm3
from retrax.optimizers import trainer as trainer
from retrax.optimizers.adafactor import Adafactor as Adafactor
from retrax.optimizers.adam import Adam as Adam
from retrax.optimizers.base import Optimizer as Optimizer
from retrax.optimizers.base import SGD as SGD
from retrax.optimizers.base import clip_grads as clip_grads
from retrax.optimizers.base import l2_norm as l2_norm
from retrax.optimizers.momentum import Momentum as Momentum
from retrax.optimizers.optax_bridge import OptaxOptimizer as OptaxOptimizer
from retrax.optimizers.optax_bridge import OptimizerLike as OptimizerLike
from retrax.optimizers.optax_bridge import as_optimizer as as_optimizer
from retrax.optimizers.optax_bridge import from_optax as from_optax
from retrax.optimizers.rms_prop import RMSProp as RMSProp
from retrax.optimizers.sm3 import MomentumType as MomentumType
from retrax.optimizers.sm3 import SM3 as SM3
from retrax.optimizers.trainer import ReversibleSerialTrainer as ReversibleSerialTrainer
from retrax.optimizers.trainer import Trainer as Trainer
