"""`Decoder`: one model's compiled decoding programs and state layouts.

The Trax-named functions (`autoregressive_sample`, `beam_search`, ...) use
`decoder_for(model)`, the model's default decoder, so that decoding a model
again reuses its compiled programs. A decoder holds a weak reference to its
model: dropping the model frees its programs and its default decoder.
"""

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from retrax.fastmath import xla_cpu
from retrax.supervised.decoding import state_layout
from retrax.validation import ArgumentValueError

# Default decoders, one per live model (weak keys).
_DEFAULT_DECODERS: 'weakref.WeakKeyDictionary[Any, Decoder]' = (
    weakref.WeakKeyDictionary())


def apply(model, weights, state, tokens, enc, rng):
  """Runs `model` on `tokens` (and encoder inputs): `(logits, new_state)`."""
  x = tokens if enc is None else (enc, tokens)
  out, state = model.pure_fn(x, weights, state, rng)
  return (out[0] if isinstance(out, (tuple, list)) else out), state


def step(model_ref, weights, state, tokens, enc, rng):
  """`apply` for the model behind the weak reference `model_ref`."""
  model = model_ref()
  if model is None:
    raise RuntimeError('The decoded model no longer exists.')
  return apply(model, weights, state, tokens, enc, rng)


def log_probs_of(logits):
  """Log-softmax in float32 over the last axis."""
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def first_step(model_ref, weights, state, tokens, enc, rng):
  """One step: `(log-probs of the token after `tokens`, new state)`."""
  logits, state = step(model_ref, weights, state, tokens, enc, rng)
  return log_probs_of(logits[:, -1]), state


def _structure(state):
  """A state's tree structure and its leaves' ranks (batch-size free)."""
  leaves, treedef = jax.tree_util.tree_flatten(state)
  return treedef, tuple(np.ndim(x) for x in leaves)


def _enc_key(enc):
  if enc is None:
    return None
  return tuple(enc.shape[1:]), np.dtype(enc.dtype).name


class Decoder:
  """Compiled decoding programs and predict-state layouts of one model.

  Programs are compiled once per configuration and shapes; layouts come from
  the layers' declarations (`retrax.layers.predict_state`), traced only for
  undeclared layers. The decoder refers to its model weakly (keep the model
  alive while decoding); `decoder_for(model)` is the one the module's
  functions use.
  """

  def __init__(self, model):
    self._model_ref = weakref.ref(model)
    self._programs = {}
    self._steps = {}

  @property
  def model(self):
    """The decoded model."""
    model = self._model_ref()
    if model is None:
      raise RuntimeError('The decoded model no longer exists.')
    return model

  # --- programs ---------------------------------------------------------------

  @property
  def compiled(self):
    """The keys (program name and configuration) of the programs made so far."""
    return tuple(self._programs)

  def program(self, key, run):
    """`(jitted, plain)` versions of `run(model_ref, *args)`, cached on `key`."""
    if key not in self._programs:
      model_ref = self._model_ref
      plain = lambda *args: run(model_ref, *args)
      self._programs[key] = (xla_cpu.jit(plain), plain)
    return self._programs[key]

  @staticmethod
  def call(program, accelerate, *args):
    """Runs a program, or (accelerate=False) the same code op by op."""
    jitted, plain = program
    if accelerate:
      return jitted(*args)
    with jax.disable_jit():
      return plain(*args)

  def settle(self, state, prefix, enc, accelerate):
    """`(state, positions fed, log-probs)`, ready for a loop over `prefix`.

    A loop's carry keeps its structure, but a first step may change it (a
    `tl.Cache` stores its outputs: the encoder of an encoder-decoder runs
    once; Transformer2's flags grow from shape () to (1,)). That step then
    runs here, on its own, on the first prefix token, so the loop's program
    sees the settled structure: the one a state left by decoding has, so
    that decoding again without resetting `model.state` reuses that program
    instead of compiling another. Otherwise nothing is fed (0 positions;
    the log-probs are zeros, unused).
    """
    _, after, vocab = self._abstract_step(enc, 1)
    if _structure(state) == _structure(after):
      return state, 0, np.zeros((prefix.shape[0], vocab), np.float32)
    model = self.model
    log_probs, state = self.call(self.program(('first_step',), first_step),
                                 accelerate, model.stacked_weights, state,
                                 jnp.asarray(prefix[:, :1]), enc, model.rng)
    return state, 1, log_probs

  # --- state layouts ----------------------------------------------------------

  def _abstract_step(self, enc, batch):
    key = (_enc_key(enc), batch)
    if key not in self._steps:
      self._steps[key] = state_layout.abstract_step(self.model, batch, enc,
                                                    apply)
    return self._steps[key]

  def logits_vocab(self, enc):
    """The size of the model's logits (traced once at batch 1)."""
    return self._abstract_step(enc, 1)[2]

  def layout(self, state, enc):
    """Rows per example of each leaf of `state` (concrete or traced)."""
    layout = state_layout.declared(self.model, state)
    if state_layout.is_complete(layout):
      return layout
    traced = state_layout.traced(self._abstract_step(enc, 1),
                                 self._abstract_step(enc, 2))
    return state_layout.completed(layout,
                                  state_layout.matching(state, traced))

  def start_state(self, enc, batch_size):
    """`model.state` for `batch_size` rows (a batch-1 state is tiled)."""
    state = self.model.state
    layout = self.layout(state, enc)
    batches = state_layout.batch_sizes(state, layout)
    if len(batches) > 1:
      raise ArgumentValueError(f'model.state mixes caches of batch sizes {batches}.')
    current = batches.pop() if batches else batch_size
    if current == batch_size:
      return state
    if current == 1:
      return state_layout.take_examples(state, layout,
                                        jnp.zeros((batch_size,), jnp.int32))
    raise ArgumentValueError(f'model.state holds caches for batch size {current} but '
                             f'decoding asks for batch_size={batch_size}; initialize '
                             'the model with that batch size (or 1).')

  def reorder_examples(self, state, rows, inputs=None):
    """See `retrax.supervised.decoding.reorder_examples`."""
    enc = None if inputs is None else np.asarray(inputs)
    return state_layout.take_examples(state, self.layout(state, enc),
                                      jnp.asarray(rows, jnp.int32))


def decoder_for(model):
  """The model's default `Decoder` (made on first use, dropped with the model)."""
  decoder = _DEFAULT_DECODERS.get(model)
  if decoder is None:
    decoder = _DEFAULT_DECODERS[model] = Decoder(model)
  return decoder


def reorder_examples(model, state, rows, inputs=None):
  """Returns a predict-mode `state` whose example `i` is example `rows[i]` of `state`.

  Every per-example cache leaf is gathered along its batch axis (whatever its
  rows per example, e.g. `batch * n_heads` for efficient attention); shared
  leaves (counters, dropout rates) are kept. `rows` may be longer than the
  batch (tiling). `inputs` are the encoder inputs of an encoder-decoder.
  """
  return decoder_for(model).reorder_examples(state, rows, inputs)
