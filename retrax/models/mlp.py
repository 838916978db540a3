"""Multi-layer perceptron."""

from retrax import layers as tl
from retrax.models import registry


@registry.register
def MLP(layer_widths=(128, 64), activation_fn=None, out_activation=False,
        flatten=True, mode='train'):
  """Dense layers of `layer_widths` with `activation_fn` (default Relu) between them."""
  del mode
  activation_fn = tl.Relu if activation_fn is None else activation_fn
  layers = []
  for width in layer_widths:
    layers.append(tl.Dense(width))
    layers.append(activation_fn())
  if not out_activation:
    layers.pop()
  return tl.Serial([tl.Flatten()] if flatten else [], layers)
