"""Reversible layers: layers that can compute their inputs from their outputs.

In a series of reversible layers the backward pass needs no stored
activations: it rebuilds each layer's input from its output, last layer
first (RevNet, https://arxiv.org/abs/1707.04585; Reformer,
https://arxiv.org/abs/2001.04451). `ReversibleSerial` does this under
`jax.custom_vjp`, so plain `jax.grad` of any loss through it keeps O(1) layer
activations alive instead of O(depth).

The building block is `ReversibleHalfResidual` (RHR), which maps

    [acc, *ctx] -> [acc + f(ctx), *ctx]

and is inverted by `acc = out - f(ctx)`. Reformer's block is
`[RHR(attention), ReversibleSwap(), RHR(feed_forward), ReversibleSwap()]`.

Randomness is replayed exactly: the backward pass recomputes each `f` with
the rng and the *pre-forward* state that the forward pass used, so dropout
masks and state-drawn randomness (e.g. LSH hashing keys) are the same and the
gradients equal those of the same network without custom gradients.

Calling `reverse`/`reverse_and_grad` with the defaults `weights=()`,
`state=()`, `rng=None` uses the layer's own weights, state and rng;
`new_state=()` means "same as `state`".

`plain_autodiff()` turns the reconstruction off for what is traced inside
it (plain `jax.grad` of the forward pass: the reference it must equal).

Modules: `layer` (the `ReversibleLayer` base class and `plain_autodiff`), `residual`
(`ReversibleHalfResidual`), `serial` (`ReversibleSerial` and its custom
gradient; `repeats` checks the repeated blocks a model declares, which it
runs as one `lax.scan`) and
`stack_ops` (`ReversibleSelect`, `ReversibleSwap` and the other weightless
reversible layers).
"""

from retrax.layers.reversible.layer import plain_autodiff as plain_autodiff
from retrax.layers.reversible.layer import ReversibleLayer as ReversibleLayer
from retrax.layers.reversible.residual import (
    ReversibleHalfResidual as ReversibleHalfResidual)
from retrax.layers.reversible.serial import ReversibleSerial as ReversibleSerial
from retrax.layers.reversible.stack_ops import (
    ReversibleConcatenatePair as ReversibleConcatenatePair)
from retrax.layers.reversible.stack_ops import (
    ReversiblePrintShape as ReversiblePrintShape)
from retrax.layers.reversible.stack_ops import ReversibleReshape as ReversibleReshape
from retrax.layers.reversible.stack_ops import ReversibleSelect as ReversibleSelect
from retrax.layers.reversible.stack_ops import ReversibleSwap as ReversibleSwap
