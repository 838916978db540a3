"""The layer model: `Layer`, `PureLayer`, `Fn` and `LayerError`.

Layers compute on a data stack. A layer takes `n_in` items from the top of
the stack and pushes `n_out` results:

  ===========  =========================================================
  `n_in = 0`   no inputs: `forward` gets an empty tuple
  `n_in = 1`   one tensor, NOT wrapped in a tuple
  `n_in > 1`   a tuple of `n_in` tensors
  ===========  =========================================================

and likewise for outputs. A layer holds `weights` and `state` as nested
tuples mirroring its sublayers (Trax's tree layout), and a JAX PRNG key `rng`.
Subclasses override `forward(inputs)` (reading `self.weights`, `self.state`,
`self.rng`, and setting `self.state`) and `init_weights_and_state(sig)`.
`pure_fn(x, weights, state, rng) -> (y, new_state)` is the pure function that
JAX traces; `__call__(x)` is the eager convenience and updates `self.state`.
"""

import inspect
import random
from typing import Any, Iterator, Optional, Sequence, Tuple

import jax
import numpy as np

from retrax import fastmath
from retrax.errors import InputValueError
# Cache markers stand for a shared layer's second (and later) occurrence.
from retrax.fastmath.tree import EMPTY_STATE as EMPTY_STATE
from retrax.fastmath.tree import EMPTY_WEIGHTS as EMPTY_WEIGHTS
from retrax.fastmath.tree import GET_STATE_FROM_CACHE as GET_STATE_FROM_CACHE
from retrax.fastmath.tree import GET_WEIGHTS_FROM_CACHE as GET_WEIGHTS_FROM_CACHE
from retrax.fastmath.tree import flatten_weights_and_state as flatten_weights_and_state
from retrax.fastmath.tree import is_state_cache_marker as _is_state_marker
from retrax.fastmath.tree import is_weights_cache_marker as _is_weights_marker
from retrax.layers import errors
from retrax.layers.cotangents import zero_cotangent
from retrax.layers.errors import LayerError as LayerError
from retrax.layers.errors import in_sublayer as in_sublayer
from retrax.layers.errors import input_error as input_error
from retrax.layers.stack import check_arity
from retrax.layers.stacked import StackedRow
from retrax.shapes import ShapeDtype
from retrax.shapes import signature
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

N_WEIGHTS_SHARDS = 1
"""Trax's weight-sharding factor (Trax's `base.N_WEIGHTS_SHARDS`, a global).

1: weights are replicated; `Accelerate` shards them over devices when a
program sets it to k > 1 (see `layers.acceleration`).
"""


class Layer:
  """Base class for composable layers in a deep learning network.

  See the module docstring for the data-stack contract. Layers that behave
  differently in training, evaluation and decoding pass `mode` (or set
  `self._mode`, as Trax layers do); layers with a length limit set
  `self._max_len` or override `max_len`.
  """

  _mode = None
  _max_len: Optional[int] = None

  def __init__(self, n_in: int = 1, n_out: int = 1, name: Optional[str] = None,
               sublayers_to_print: Optional[Sequence[int]] = None,
               mode: Optional[str] = None) -> None:
    if mode is not None:
      self._mode = mode
    self._n_in = n_in
    self._n_out = n_out
    self._name = self.__class__.__name__ if name is None else name
    self._sublayers_to_print = sublayers_to_print
    self._sublayers: Sequence[Layer] = ()
    self._rng = None
    self._rng_seed_int = random.randint(0, 2**31 - 1)
    # Trees of arrays (or cache markers), replaced whole by subclasses.
    self._weights: Any = EMPTY_WEIGHTS
    self._state: Any = EMPTY_STATE
    self._caller = errors.find_caller()
    self._init_cached = False
    self._path_element_fn = None

  def __repr__(self):
    def indent(s):
      return '  ' + s.replace('\n', '\n  ')
    name = self._name
    if self.n_in != 1:
      name += f'_in{self.n_in}'
    if self.n_out != 1:
      name += f'_out{self.n_out}'
    subs = (self._sublayers_to_print if self._sublayers_to_print is not None
            else self.sublayers)
    if not subs:
      return name
    # Invisible sublayers (empty names, e.g. AssertShape) are left out.
    strs = [str(x) for x in subs if str(x)]
    return name + '[\n' + '\n'.join(indent(s) for s in strs) + '\n]'


  def __call__(self, x, weights=None, state=None, rng=None):
    """Runs the layer eagerly on `x` with its own weights; updates `self.state`."""
    weights = self.stacked_weights if weights is None else weights
    rng = self.rng if rng is None else rng
    if state is not None:
      self.state = state
    outputs, new_state = self.pure_fn(x, weights, self.state, rng)
    self.state = new_state
    return outputs

  def forward(self, inputs):
    """Computes outputs from inputs; override in subclasses."""
    raise NotImplementedError(
        f'Layer {self._name} does not define forward(); subclasses must.')

  def init_weights_and_state(self, input_signature):
    """Creates `self.weights` and `self.state` for inputs of this signature."""
    del input_signature

  @property
  def has_backward(self):
    """True if the layer defines its own `backward` (custom gradient)."""
    return False

  def backward(self, inputs, output, grad, weights, state, new_state, rng):
    """Custom backward pass: returns (input_grad, weights_grad)."""
    raise NotImplementedError(
        f'Layer {self._name} has has_backward=True but no backward().')

  # --- properties -----------------------------------------------------------

  @property
  def name(self) -> str:
    """The layer's name, as its repr and error paths show it."""
    return self._name

  @property
  def n_in(self) -> int:
    """How many items the layer takes from the data stack."""
    return self._n_in

  @property
  def n_out(self) -> int:
    """How many items the layer pushes onto the data stack."""
    return self._n_out

  @property
  def sublayers(self):
    """The layer's direct sublayers (a list; empty for a leaf layer)."""
    return self._sublayers

  @property
  def mode(self) -> Optional[str]:
    """`'train'`, `'eval'` or `'predict'` for a layer built with a mode; else None."""
    return self._mode

  @property
  def max_len(self) -> Optional[int]:
    """The most positions the layer handles (a table or cache size), or None."""
    return self._max_len

  @property
  def caller(self):
    """Where the layer was created: `{'filename': ..., 'lineno': ...}`."""
    return self._caller

  def walk(self) -> Iterator['Layer']:
    """Yields this layer and all its sublayers, depth-first, parents first.

    The order is pre-order: the layer, then the walk of its first sublayer,
    then of its second, and so on. A layer used twice appears twice.
    """
    yield self
    for sublayer in self.sublayers:
      yield from sublayer.walk()

  def path_element(self, index):
    """How LayerError paths name this layer's sublayer `index` (None: omit)."""
    if self._path_element_fn is not None:
      return self._path_element_fn(index)
    return f'{self._name}[{index}]'

  def set_path_elements(self, fn):
    """Names sublayer `i` as `fn(i)` in LayerError paths (None leaves it out)."""
    self._path_element_fn = fn

  @property
  def weights(self):
    """Weights: a tree of arrays; for a combinator, a tuple with one entry per sublayer."""
    if not self.sublayers:
      w = self._weights
      # Rows of an enclosing stacked block (`ReversibleSerial`): sliced out.
      return w.get() if isinstance(w, StackedRow) else w
    return self._gather_from_sublayers('weights', self._weights)

  @weights.setter
  def weights(self, weights):
    if _is_weights_marker(weights):
      return
    if not self.sublayers:
      self._weights = weights
      return
    self._weights = self._spread_to_sublayers('weights', 'weight', weights,
                                              _is_weights_marker)

  @property
  def stacked_weights(self):
    """The weights as held: `weights`, but repeated blocks stay one `StackedLayers`.

    A `ReversibleSerial` of declared repeated blocks holds their weights
    stacked (one copy, scanned over); `weights` shows them per layer, as
    Trax does, by slicing that stack. This tree is what the training step
    passes to `jax.jit` (no slicing, no restacking); setting `weights` to it
    takes it back without a copy.
    """
    if not self.sublayers or type(self).weights is not LAYER_WEIGHTS:
      return self.weights
    return self._gather_from_sublayers('stacked_weights', self._weights)

  @property
  def held_weights(self):
    """Exactly what this layer and its sublayers hold, to put back as it was.

    As `stacked_weights`, except that a layer inside a stacked block gives
    its `StackedRow` (not a slice): saving and restoring it copies nothing.
    """
    if not self.sublayers:
      return self._weights
    if type(self).weights is not LAYER_WEIGHTS:
      return self.weights
    return self._gather_from_sublayers('held_weights', self._weights)

  @property
  def state(self):
    """State: non-trainable values (caches, counters); tree like `weights`."""
    if not self.sublayers:
      return self._state
    return self._gather_from_sublayers('state', self._state)

  @state.setter
  def state(self, state):
    if _is_state_marker(state):
      return
    if not self.sublayers:
      self._state = state
      return
    self._state = self._spread_to_sublayers('state', 'state', state,
                                            _is_state_marker)

  def _gather_from_sublayers(self, attr, own):
    """A combinator's `weights`/`state`: its sublayers' (or its own markers)."""
    return tuple(getattr(layer, attr) if x is None else x
                 for layer, x in zip(self.sublayers, own))

  def _spread_to_sublayers(self, attr, what, tree, is_marker):
    """Sets a combinator's `weights`/`state` on its sublayers; returns the markers kept here."""
    if not isinstance(tree, (list, tuple)) or len(tree) != len(self.sublayers):
      got = len(tree) if isinstance(tree, (list, tuple)) else type(tree)
      raise InputValueError(
          f'{self._name}: Number of {what} elements ({got}) does not equal '
          f'the number of sublayers ({len(self.sublayers)}); give one entry '
          f'per sublayer.')  # Trax's wording, which its tests match.
    for sublayer, x in zip(self.sublayers, tree):
      setattr(sublayer, attr, x)
    return [x if is_marker(x) else None for x in tree]

  @property
  def rng(self):
    """This layer's PRNG key (created lazily from a random seed)."""
    if self._rng is None:
      self._rng = fastmath.random.get_prng(self._rng_seed_int)
    return self._rng

  @rng.setter
  def rng(self, rng):
    """Sets the key here and splits it among sublayers, recursively."""
    self._rng = rng
    if self.sublayers:
      for sublayer, r in zip(self.sublayers,
                             fastmath.random.split(rng, len(self.sublayers))):
        sublayer.rng = r

  def _settable_attrs(self):
    return ('weights', 'state', 'rng')

  def __setattr__(self, attr, value):
    if attr[0] != '_' and attr not in self._settable_attrs():
      raise ArgumentValueError(
          f'Layers only allow setting {self._settable_attrs()} as public '
          f'attributes, not {attr!r} (a typo?).')
    super().__setattr__(attr, value)

  # --- initialization -------------------------------------------------------

  def init(self, input_signature: Any, rng: Any = None,
           use_cache: bool = False) -> Tuple[Any, Any]:
    """Initializes weights and state from an input signature; returns them.

    Args:
      input_signature: a `ShapeDtype` (one input) or a tuple of them; arrays
        are accepted too and replaced by their signature.
      rng: a PRNG key, or None to use this layer's own.
      use_cache: if True and this layer was already initialized elsewhere in
        the same network, return `(GET_WEIGHTS_FROM_CACHE,
        GET_STATE_FROM_CACHE)` markers (weight sharing).

    Returns:
      `(weights, state)`.
    """
    input_signature = signature(input_signature)
    try:
      if self._init_cached and use_cache:
        return (GET_WEIGHTS_FROM_CACHE, GET_STATE_FROM_CACHE)
      if rng is not None:
        self.rng = rng
      check_arity(self, input_signature, self.n_in, 'init')
      self.init_weights_and_state(input_signature)
      if use_cache:
        self._init_cached = True
      else:
        self.clear_init_cache()
      return (self.weights, self.state)
    except LayerError:
      self.clear_init_cache()
      raise
    except Exception as e:
      self.clear_init_cache()
      raise LayerError(self._name, 'init', self._caller, input_signature,
                       errors.short_traceback(e)) from e

  def new_weights_and_state(self, input_signature):
    """Trax 1.2 name for `init`: returns `(weights, state)`."""
    return self.init(input_signature)

  def new_weights(self, input_signature):
    """Trax 1.2 name: initializes and returns the weights."""
    return self.init(input_signature)[0]

  def clear_init_cache(self):
    """Forgets, here and below, which layers `init(use_cache=True)` has seen."""
    self._init_cached = False
    for sublayer in self.sublayers:
      sublayer.clear_init_cache()

  def weights_and_state_signature(self, input_signature, unsafe=False):
    """Returns the `(weights, state)` signature `init` would produce, without computing it."""
    rng, state, weights = self.rng, self.state, self.held_weights
    try:
      return fastmath.abstract_eval(lambda s: self.init(s))(
          signature(input_signature))
    finally:
      # Put back what the abstract init replaced (by tracers, or on error).
      self._rng = rng
      if not unsafe:
        self._restore(weights, state)
      if self.sublayers:
        self.rng = rng

  # --- running --------------------------------------------------------------

  def pure_fn(self, x: Any, weights: Any, state: Any, rng: Any,
              use_cache: bool = False) -> Tuple[Any, Any]:
    """Applies the layer as a pure function: returns `(outputs, new_state)`.

    Do not override; override `forward`. With `use_cache=True` (used inside
    combinators) the weights stay set on the object so that a shared layer's
    later uses see them.
    """
    old_rng = self._rng
    # Kept only to put back: with `use_cache` the run's weights and state
    # stay (gathering them walks the whole subtree, at every nesting level).
    old = None if use_cache else (self.held_weights, self.state)
    try:
      check_arity(self, x, self.n_in, 'pure_fn')
      self._rng = rng
      if _is_weights_marker(weights) and _is_state_marker(state):
        was_cached = True
      else:
        was_cached = False
        self.weights, self.state = weights, state
      if not self.has_backward:
        outputs = self.forward(x)
        s = self.state
      else:
        outputs, s = self._do_custom_gradients(x)
        self.state = s
      self._rng = old_rng
      if old is not None:
        self.weights, self.state = old
      if was_cached:
        s = GET_STATE_FROM_CACHE
      return outputs, s
    except Exception as e:
      self._rng = old_rng
      if old is not None:
        self._restore(*old)
      if isinstance(e, LayerError):
        raise
      raise LayerError(self._name, 'pure_fn', self._caller, signature(x),
                       errors.short_traceback(e)) from e

  def _restore(self, weights, state):
    """Puts back weights and state after a failed call (best effort)."""
    try:
      self.weights, self.state = weights, state
    except Exception:
      pass

  def output_signature(self, input_signature: Any) -> Any:
    """Returns the output signature for inputs of `input_signature`."""
    return self._forward_abstract(signature(input_signature))[0]

  def _forward_abstract(self, input_signature):
    """Shapes and dtypes of `(outputs, state)` for an input signature."""
    rng_sig = ShapeDtype((2,), np.uint32)
    # jax's map keeps a stacked block stacked (no slicing of its arrays).
    weights_sig = jax.tree_util.tree_map(_abstract, self.stacked_weights)
    state_sig = fastmath.nested_map(_abstract, self.state)
    try:
      return fastmath.abstract_eval(self.pure_fn)(
          input_signature, weights_sig, state_sig, rng_sig)
    except LayerError:
      raise
    except Exception as e:
      raise LayerError(self._name, '_forward_abstract', self._caller,
                       input_signature, errors.short_traceback(e)) from e

  def _forward_with(self, inputs, weights, state, rng):
    """`forward` with the given weights, state and rng set for the call; returns (out, new_state).

    The layer's own weights, state and rng are put back afterwards.
    """
    old = self.held_weights, self.state, self._rng
    self.weights, self.state, self._rng = weights, state, rng
    try:
      out = self.forward(inputs)
      return out, self.state
    finally:
      self.weights, self.state, self._rng = old

  def _do_custom_gradients(self, x):
    """Runs `forward` with gradients given by `self.backward`."""

    @jax.custom_vjp
    def f(inputs, weights, state, rng):
      return self._forward_with(inputs, weights, state, rng)

    def f_fwd(inputs, weights, state, rng):
      out, s = self._forward_with(inputs, weights, state, rng)
      return (out, s), (inputs, out, weights, state, s, rng)

    def f_bwd(res, grads):
      inputs, out, weights, state, new_state, rng = res
      x_grad, w_grad = self.backward(inputs, out, grads[0], weights, state,
                                     new_state, rng)
      return (x_grad, w_grad, zero_cotangent(state), zero_cotangent(rng))

    f.defvjp(f_fwd, f_bwd)
    return f(x, self.stacked_weights, self.state, self._rng)

  # --- files ----------------------------------------------------------------

  def init_from_file(self, file_name: Any, weights_only: bool = False,
                     input_signature: Any = None) -> Tuple[Any, Any]:
    """Loads weights (and state) from a Trax checkpoint or a retrax checkpoint.

    Reads Trax's `save_to_file` pickles, `Loop` checkpoints (`.pkl.gz` with a
    `.weights.npy.gz` sidecar), legacy `Trainer` state and 1.2.x `model.pkl`,
    through a restricted unpickler that runs no code, and retrax's native
    files. Returns `(weights, state)`.
    """
    # retrax.checkpoints reads and writes weights files (and imports no
    # layer); imported on first use, so that importing the layers stays light.
    from retrax.checkpoints import layer_io
    return layer_io.init_layer_from_file(self, file_name, weights_only,
                                         input_signature)

  def save_to_file(self, file_name: Any, weights_only: bool = False,
                   input_signature: Any = None) -> None:
    """Writes weights (and state) in Trax's single-file layout, atomically."""
    from retrax.checkpoints import layer_io  # On first use (init_from_file).
    layer_io.save_layer_to_file(self, file_name, weights_only, input_signature)


# `Layer`'s own `weights` property: a subclass that replaces it (`Accelerate`)
# holds its weights its own way, and `stacked_weights` is then `weights`;
# `ReversibleSerial` calls its getter and setter. Taken from the class dict:
# mypy types a property with a setter as an overloaded function, with no
# `fget`/`fset`.
LAYER_WEIGHTS = vars(Layer)['weights']


def unflatten_weights_and_state(flat_weights, flat_state,
                                weights_and_state_signature,
                                weights_only=False):
  """Rebuilds `(weights, state)` from flat leaf lists and their signature (Trax's name).

  See `retrax.checkpoints.unflatten_weights_and_state`: a leaf count or shape
  that does not fit raises `TreeStructureError`; with `weights_only=True` the
  state is None.
  """
  from retrax.checkpoints import tree  # On first use (Layer.init_from_file).
  return tree.unflatten_weights_and_state(flat_weights, flat_state,
                                          weights_and_state_signature,
                                          weights_only=weights_only)


def _abstract(x):
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return ShapeDtype(x.shape, x.dtype)
  return x


class PureLayer(Layer):
  """A layer with no weights and no randomness: a pure function of its inputs.

  `forward_fn` takes the inputs packed as in the stack contract (one item
  bare, several as a tuple) and returns `n_out` outputs packed the same way.
  """

  def __init__(self, forward_fn, n_in=1, n_out=1, name='PureLayer'):
    super().__init__(n_in, n_out, name)
    self._forward_fn = forward_fn

  def forward(self, inputs):
    if self.n_in != 1:  # One input may be a tuple, passed whole.
      check_arity(self, inputs, self.n_in, 'forward', exact=True)
    out = self._forward_fn(inputs)
    if self.n_out == 0 and (out is None or _is_empty(out)):
      return ()
    _validate_forward_output(out, self.n_out, self._name)
    return out


def Fn(name, f, n_out=1):
  """Returns a weightless layer applying `f`; `n_in` is `f`'s number of positional args.

  `f` takes only positional arguments (no defaults, `*args` or `**kwargs`),
  for example `Fn('SumAndMax', lambda x0, x1: (x0 + x1, jnp.maximum(x0, x1)),
  n_out=2)` takes two inputs and gives two outputs (a tuple). `n_out` must be
  given whenever it is not 1.
  """
  if not callable(f):
    raise ArgumentTypeError(f'Fn {name!r}: f must be a function; got {f!r}.')
  try:
    argspec = inspect.getfullargspec(f)
  except TypeError as e:
    raise ArgumentTypeError(f'Fn {name!r}: cannot read the arguments of {f!r} ({e}); '
                            'wrap it in a lambda or def.') from e
  if argspec.defaults is not None:
    raise ArgumentValueError(f'Fn {name!r}: function has default arguments (not '
                             f'allowed): {argspec.args}, defaults {argspec.defaults}.')
  if argspec.varkw is not None:
    raise ArgumentValueError(f'Fn {name!r}: function has keyword arguments (not '
                             f'allowed): **{argspec.varkw}.')
  if argspec.varargs is not None:
    raise ArgumentValueError(f'Fn {name!r}: function has variable args (not allowed):'
                             f' *{argspec.varargs}; give each input its own argument.')
  if argspec.kwonlyargs:
    raise ArgumentValueError(f'Fn {name!r}: function has keyword-only arguments (not '
                             f'allowed): {argspec.kwonlyargs}.')
  if not isinstance(n_out, int) or n_out < 0:
    raise ArgumentValueError(f'Fn {name!r}: n_out must be an int >= 0; got {n_out!r}.')
  n_in = len(argspec.args)
  if inspect.ismethod(f):
    n_in -= 1

  def forward(xs):
    if n_in == 1 and not (isinstance(xs, (tuple, list)) and len(xs) == 1):
      return f(xs)  # One input, even a (nested) tuple, is passed whole.
    if not isinstance(xs, (tuple, list)):
      xs = (xs,)
    return f(*xs)
  return PureLayer(forward, n_in=n_in, n_out=n_out, name=name or 'Fn')


def _validate_forward_output(out, n_out, name):
  """Checks that a function layer promising `n_out != 1` outputs returned a tuple.

  As in Trax, a tuple of another length passes (e.g. a `Scan` body returning
  its carry as an extra item); a single array where a tuple is promised
  raises, as the stack would silently be one item short.
  """
  if n_out == 1:
    return
  if not isinstance(out, (tuple, list)):
    got = (f'one array {signature(out)}' if hasattr(out, 'shape')
           else f'one {type(out).__name__}')
    raise ArgumentValueError(f'{name} promises n_out={n_out} outputs (a tuple) but its '
                             f'function returned {got}; return a tuple or fix n_out.')


def _is_empty(x):
  return isinstance(x, (list, tuple)) and len(x) == 0


def to_list(outputs):
  """Converts layer outputs to nested lists, for equality tests."""
  if isinstance(outputs, (list, tuple)):
    return [y.tolist() for y in outputs]
  return outputs.tolist()
