"""Small networks over game-frame sequences: `AtariCnn`, `AtariCnnBody`, `FrameStackMLP`."""

from retrax import layers as tl
from retrax.fastmath import numpy as jnp
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _FrameStack(n_frames):
  """Stacks each frame with its `n_frames - 1` predecessors along the last axis.

  `(B, T, ..., C)` becomes `(B, T, ..., C * n_frames)`: copy k is the input
  shifted right by k frames along T (zeros entering).
  """
  if n_frames < 1:
    raise ArgumentValueError(f'n_frames must be at least 1; got {n_frames}.')
  if n_frames == 1:
    return []
  return [
      tl.Branch(*map(_shift_right, range(n_frames))),
      tl.Concatenate(n_items=n_frames, axis=-1),
  ]


def _BytesToFloats():
  """Layer scaling byte values to [0, 1]: `x / 255`."""
  return tl.Fn('BytesToFloats', lambda x: x.astype(jnp.float32) / 255.0)


@registry.register
def AtariCnn(n_frames=4, hidden_sizes=(32, 32), output_size=128,
             mode='train'):
  """CNN over frame sequences: `(B, T, H, W, C)` bytes to `(B, T, output_size)`.

  Frames are scaled to [0, 1] and stacked with their `n_frames - 1`
  predecessors, then two 5x5 stride-2 'SAME' convolutions (Relu), a
  flatten of all but (B, T) and a `Dense(output_size)` with Relu.
  """
  del mode
  return tl.Serial(
      _BytesToFloats(),
      _FrameStack(n_frames=n_frames),  # (B, T, H, W, n_frames * C)
      tl.Conv(hidden_sizes[0], (5, 5), (2, 2), 'SAME'),
      tl.Relu(),
      tl.Conv(hidden_sizes[1], (5, 5), (2, 2), 'SAME'),
      tl.Relu(),
      tl.Flatten(n_axes_to_keep=2),  # B, T and the rest.
      tl.Dense(output_size),
      tl.Relu(),
  )


@registry.register
def AtariCnnBody(n_frames=4, hidden_sizes=(32, 64, 64), output_size=512,
                 mode='train', kernel_initializer=None, padding='VALID'):
  """The DQN-style body: 8x8/4, 4x4/2, 3x3/1 convolutions, then `Dense(output_size)`.

  Input `(B, T, H, W, C)` bytes, output `(B, T, output_size)`; frames are
  scaled and stacked as in `AtariCnn`.
  """
  del mode
  return tl.Serial(
      _BytesToFloats(),
      _FrameStack(n_frames=n_frames),
      tl.Conv(hidden_sizes[0], (8, 8), (4, 4), padding=padding,
                       kernel_initializer=kernel_initializer),
      tl.Relu(),
      tl.Conv(hidden_sizes[1], (4, 4), (2, 2), padding=padding,
                       kernel_initializer=kernel_initializer),
      tl.Relu(),
      tl.Conv(hidden_sizes[2], (3, 3), (1, 1), padding=padding,
                       kernel_initializer=kernel_initializer),
      tl.Relu(),
      tl.Flatten(n_axes_to_keep=2),
      tl.Dense(output_size),
      tl.Relu(),
  )


@registry.register
def FrameStackMLP(n_frames=4, hidden_sizes=(64,), output_size=64,
                  mode='train'):
  """MLP on each frame stacked with its `n_frames - 1` predecessors.

  Maps `(B, T, d)` to `(B, T, output_size)`.
  """
  del mode
  return tl.Serial(
      _FrameStack(n_frames=n_frames),
      [[tl.Dense(d_hidden), tl.Relu()] for d_hidden in hidden_sizes],
      tl.Dense(output_size),
  )


def _shift_right(n):
  return [tl.ShiftRight()] * n
