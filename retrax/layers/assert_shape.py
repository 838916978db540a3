"""Shape assertions with einsum-like specs (`'...a,ab->...b'`), as Trax's `assert_shape`.

Each letter names one dimension; equal letters must have equal sizes (also
between inputs and outputs); a digit is a fixed size; `...` matches any
number of dimensions, the same ones on both sides.
"""

import functools
import inspect
import sys
import string

from retrax.errors import InputValueError
from retrax.layers import base
from retrax.layers import combinators
from retrax.validation import ArgumentValueError


def assert_shape(specification):
  """Decorator: checks input/output shapes of a layer class or layer-making function.

  A decorated function's layer is wrapped as `Serial(AssertShape, layer,
  AssertShape)` (Trax's tree layout: two empty weight entries around it);
  a decorated class gets the checks inside `forward`.
  """
  message = _defined_at(sys._getframe(1))

  def wrap_cls(cls):
    forward, init = cls.forward, cls.__init__
    before_spec, after_spec = specification.split('->')

    @functools.wraps(init)
    def init_wrapper(self, *args, **kwargs):
      before = AssertShape(before_spec, message=message + ' function input')
      after = AssertShape(after_spec, message=message + ' function output',
                          linked_to=before)
      init(self, *args, **kwargs)
      self._before_assert = before
      self._after_assert = after

    @functools.wraps(forward)
    def forward_wrapper(self, x, *args, **kwargs):
      x = self._before_assert.forward(x)
      y = forward(self, x, *args, **kwargs)
      return self._after_assert.forward(y)

    cls.forward, cls.__init__ = forward_wrapper, init_wrapper
    return cls

  def wrap_fun(fun):
    @functools.wraps(fun)
    def fun_wrapper(*args, **kwargs):
      return AssertFunction(specification, fun(*args, **kwargs), message)
    return fun_wrapper

  return lambda f: wrap_cls(f) if inspect.isclass(f) else wrap_fun(f)


def _defined_at(frame):
  # sys._getframe is cheap; inspect.stack() reads source files (slow imports).
  return f'Defined at {frame.f_code.co_filename}:{frame.f_lineno}'


def AssertFunction(specification, layer, message=None):
  """Wraps `layer` as `Serial(AssertShape(in), layer, AssertShape(out))`."""
  if message is None:
    message = _defined_at(sys._getframe(1))
  before_spec, after_spec = specification.split('->')
  before = AssertShape(before_spec, message=message + ' function input')
  after = AssertShape(after_spec, message=message + ' function output',
                      linked_to=before)
  return combinators.Serial(before, layer, after)


class AssertShape(base.Layer):
  """Checks the shapes of its inputs against a spec and returns them unchanged.

  Invisible when printing unless `visible_layer=True`. With `linked_to`
  (another AssertShape, e.g. the input check of a function), dimension
  letters and `...` continue the sizes that check last bound.
  """

  def __init__(self, spec, message=None, visible_layer=False, linked_to=None):
    super().__init__(name='AssertShape' if visible_layer else '')
    spec = spec.replace('...', '.')
    for letter in spec:
      if letter not in string.ascii_letters + string.digits + '.,':
        raise ArgumentValueError(f'AssertShape: spec {spec!r} has the character '
                                 f'{letter!r}; use letters, digits, "..." and ",".')
    self._specs = spec.split(',')
    self._n_in = self._n_out = len(self._specs)
    self._message = message or ''
    self._linked_to = linked_to
    self._defined = {}
    self._ellipsis = None

  @property
  def bindings(self):
    """`(sizes by letter, the dimensions '...' stood for)` at the last call."""
    return dict(self._defined), self._ellipsis

  def forward(self, xs):
    items = xs if self._n_in > 1 else (xs,)
    if not isinstance(items, (list, tuple)) or len(items) != self._n_in:
      raise InputValueError(f'AssertShape: expected {self._n_in} tensors for spec '
                            f'{",".join(self._specs)}; {self._message}')
    if self._linked_to is not None:
      defined, ellipsis = self._linked_to.bindings
    else:
      defined, ellipsis = {}, None
    for spec, x in zip(self._specs, items):
      shape = tuple(getattr(x, 'shape', ()))
      ellipsis = self._check(spec, shape, defined, ellipsis)
    self._defined, self._ellipsis = defined, ellipsis
    return xs

  def _check(self, spec, shape, defined, ellipsis):
    def fail(why):
      raise InputValueError(f'Shape {shape} does not match spec {spec!r} '
                            f'({why}); {self._message}')
    if spec.count('.') > 1:
      raise ArgumentValueError(f'AssertShape: malformed spec {spec!r} (written with '
                               "'.' for '...'): at most one '...' per tensor; "
                               f'{self._message}')
    if '.' in spec:
      i = spec.index('.')
      n_tail = len(spec) - i - 1
      if len(shape) < len(spec) - 1:
        fail(f'rank {len(shape)} < {len(spec) - 1}')
      dots = shape[i:len(shape) - n_tail]
      if ellipsis is not None and dots != ellipsis:
        fail(f'"..." is {dots} here but {ellipsis} before')
      ellipsis = dots
      letters = list(zip(spec[:i], shape[:i]))
      letters += list(zip(spec[i + 1:], shape[len(shape) - n_tail:]))
    else:
      if len(shape) != len(spec):
        fail(f'rank {len(shape)} != {len(spec)}')
      letters = list(zip(spec, shape))
    for letter, dim in letters:
      if letter in string.digits:
        if dim != int(letter):
          fail(f'dimension {letter!r} must be {letter}, got {dim}')
      elif letter in defined and defined[letter] != dim:
        fail(f'dimension {letter!r} is {dim} here but {defined[letter]} '
             'before')
      else:
        defined[letter] = dim
    return ellipsis
