"""The improved Neural GPU (Freivalds & Liepins, https://arxiv.org/abs/1702.08727).

Tokens on a 2-D grid `(batch, height, width)` are embedded, then one
convolutional GRU with diagonal gating is applied `steps` times (the same
weights each time), then projected to `vocab_size` logits per cell.
"""

from retrax import layers as tl
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.models import registry


def SaturationCost(x, limit=0.9):
  """`min(0, |x| - limit)`, elementwise: the saturation term of the NGPU paper."""
  return jnp.minimum(0, jnp.abs(x) - limit)


def DiagonalGate():
  """Shifts the first third of the channels one cell right and the last third left.

  Takes `(batch, height, width, depth)` with `depth` divisible by 3; the shift
  is along `width`, filling with zeros; the middle third is unchanged.
  """
  def f(x):
    depth = x.shape[-1] // 3
    if 3 * depth != x.shape[-1]:
      raise InputValueError(f'DiagonalGate: the last axis must be divisible by 3; '
                            f'got shape {x.shape}.')
    padded = jnp.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
    return jnp.concatenate([padded[:, :, :-2, :depth],
                            padded[:, :, 1:-1, depth:2 * depth],
                            padded[:, :, 2:, 2 * depth:]], axis=3)
  return tl.Fn('DiagonalGate', f)


def ConvDiagonalGRU(units, kernel_size=(3, 3)):
  """A convolutional GRU cell (`SAME` convolutions) with `DiagonalGate` memory."""
  def conv():
    return tl.Conv(filters=units, kernel_size=kernel_size, padding='SAME')
  return tl.GeneralGRUCell(candidate_transform=conv,
                           memory_transform_fn=DiagonalGate,
                           gate_nonlinearity=tl.HardSigmoid,
                           candidate_nonlinearity=tl.HardTanh)


@registry.register
def NeuralGPU(d_feature=96, steps=16, vocab_size=2, mode='train'):
  """The Neural GPU: `(batch, height, width)` ids -> `(..., vocab_size)` logits.

  Args:
    d_feature: Channels of the memory (the embedding size); divisible by 3.
    steps: How many times the shared recurrent cell is applied.
    vocab_size: Number of token ids (input and output).
    mode: Unused (no layer depends on it), kept for Trax's signature.
  """
  del mode
  cell = ConvDiagonalGRU(units=d_feature)
  return tl.Serial(
      tl.Embedding(vocab_size=vocab_size, d_feature=d_feature),
      [cell] * steps,
      tl.Dense(vocab_size),
  )
