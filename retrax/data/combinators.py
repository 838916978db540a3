"""Stream combinators: `Serial` and `Parallel` over generator functions.

A *stream function* maps an iterator of examples to a new iterator of
examples; a *source* is a stream function that ignores its input (it is called
with ``None``). `Serial` composes stream functions the way `layers.Serial`
composes layers::

  pipeline = Serial(
      lambda _: iter([(1, 2), (3, 4)]),   # source
      lambda g: map(lambda x: (x[0] + 1, x[1]), g),
  )
  list(pipeline())  # [(2, 2), (4, 4)]
"""

import math
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

StreamFn = Callable[..., Iterator[Any]]


def _flatten_fns(fns):
  """Flattens nested lists/tuples of stream functions, in order."""
  flat = []
  for f in fns:
    if isinstance(f, (list, tuple)):
      flat.extend(_flatten_fns(f))
    else:
      flat.append(f)
  return flat


def Serial(*fns: Any) -> StreamFn:
  """Combines stream functions into one that runs them one after another.

  Nested lists or tuples of functions are flattened first (as Trax does), so
  ``Serial(a, [b, c])`` equals ``Serial(a, b, c)``.

  Args:
    *fns: stream functions; the first one usually is a source (called with the
      input of the composed function, ``None`` by default).

  Returns:
    A function ``composed(generator=None)`` that feeds ``generator`` to the
    first function and each result to the next.

  Raises:
    TypeError: if some element is not callable.
  """
  flat = _flatten_fns(fns)
  for i, f in enumerate(flat):
    if not callable(f):
      raise ArgumentTypeError(
          f'Serial expects stream functions (callables taking an iterator); '
          f'element {i} is {f!r} of type {type(f).__name__}.')

  def composed_fns(generator=None):
    for f in flat:
      generator = f(generator)
    return generator
  return composed_fns


class _Exhausted(Exception):
  """Raised internally when a stream inside `Parallel` runs dry."""


def _take(generator):
  try:
    return next(generator)
  except StopIteration:
    raise _Exhausted() from None


def _emit_gradually(sorted_counters_with_gens, prev_counter):
  """Yields (a (b c^k)^m)^* style interleavings; see `Parallel`."""
  if sorted_counters_with_gens:
    counter, generator = sorted_counters_with_gens[0]
    repeats = math.floor(counter / prev_counter)
    for _ in range(repeats):
      yield _take(generator)
      yield from _emit_gradually(sorted_counters_with_gens[1:], counter)


def Parallel(
    fns: Optional[Sequence[StreamFn]] = None,
    counters: Optional[Sequence[int]] = None,
    reweight_by_minimum: bool = False,
    gradually_reweight: bool = False,
    use_remainders: bool = False) -> StreamFn:
  """Combines stream functions into one that interleaves their examples.

  Without `counters` the streams alternate: ``a0 b0 a1 b1 ...``. With
  ``counters=(2, 1, 3)`` each round takes 2, 1 and 3 examples, one stream
  after another while a stream still has quota left:
  ``a0 b0 c0 a1 c1 c2 | a2 b1 c3 ...``. Streams with a zero counter are
  dropped.

  With ``reweight_by_minimum=True`` each counter is divided (floor) by the
  smallest one, so (10, 100) becomes (1, 10).

  With ``gradually_reweight=True`` streams are sorted by counter and emitted by
  the recursive rule of Trax: counters 1, 20, 40 give ``(a (b c^2)^20)^*``.
  With ``use_remainders=True`` as well, each round then also emits the
  examples that the integer ratios left out (counters 1, 20, 45: five more
  from the third stream).

  Args:
    fns: stream functions to interleave; each is called with the composed
      function's argument, or with no argument when that is ``None``.
    counters: non-negative ints, one per stream (default: all 1).
    reweight_by_minimum: divide counters by their minimum.
    gradually_reweight: use the recursive interleaving described above.
    use_remainders: with `gradually_reweight`, emit the remainders too.

  Returns:
    A function ``parallel_generator(gen=None)`` returning the interleaved
    iterator. It ends when any stream it draws from is exhausted (Trax raises
    ``RuntimeError`` there instead).

  Raises:
    ValueError: for a counters/fns length mismatch, a negative counter, or
      all-zero counters.
  """
  fns, counters = _kept_streams(list(fns or []), counters)
  if reweight_by_minimum:
    smallest = min(counters)
    counters = [math.floor(c / smallest) for c in counters]

  def parallel_generator(gen: Optional[Iterable[Any]] = None):
    generators = [iter(f() if gen is None else f(gen)) for f in fns]
    if gradually_reweight:
      inner = _gradual(counters, generators, use_remainders)
    else:
      inner = _round_robin(counters, generators)
    try:
      yield from inner
    except _Exhausted:
      return

  return parallel_generator


def _kept_streams(fns, counters):
  """`(fns, counters)` without the zero-counter streams (counters default 1)."""
  if not fns:
    raise ArgumentValueError('Parallel needs at least one stream function in `fns`.')
  if not counters:
    return fns, [1] * len(fns)
  counters = list(counters)
  if len(counters) != len(fns):
    raise ArgumentValueError(
        f'Parallel got {len(fns)} stream functions but {len(counters)} '
        f'counters; give one counter per stream.')
  if any(c < 0 for c in counters):
    raise ArgumentValueError(f'Parallel counters must be >= 0, got {counters}.')
  keep = [j for j, c in enumerate(counters) if c != 0]
  if not keep:
    raise ArgumentValueError(f'Parallel counters are all zero: {counters}.')
  return [fns[j] for j in keep], [counters[j] for j in keep]


def _gradual(counters, generators, use_remainders):
  """`Parallel`'s `gradually_reweight` order (with optional remainders)."""
  pairs = sorted(zip(counters, generators), key=lambda p: p[0])
  while True:
    yield from _emit_gradually(pairs, min(counters))
    if use_remainders:
      fractions: list[int] = []
      for i, (counter, generator) in enumerate(pairs):
        processed = math.prod(fractions)
        for _ in range(counter - processed):
          yield _take(generator)
        if i < len(pairs) - 1:
          fractions.append(math.floor(pairs[i + 1][0] / counter))


def _round_robin(counters, generators):
  """`Parallel`'s default order: each round takes `counters[i]` from stream i."""
  current = [0] * len(generators)
  total = sum(counters)
  while True:
    for idx, generator in enumerate(generators):
      if current[idx] < counters[idx]:
        current[idx] += 1
        if sum(current) == total:
          current = [0] * len(generators)
        yield _take(generator)
