"""`Prefetch`: run the upstream pipeline in a background thread.

Trax forks a process through ``multiprocessing.dummy`` (threads in fact) and
can hang when the producer raises; here a daemon thread fills a bounded queue,
an exception in the producer is re-raised in the consumer, and closing (or
dropping) the consumer stops the producer, so nothing blocks interpreter exit.
"""

import queue
import threading
from typing import Any, Callable, Iterable, Iterator
from retrax.configurable import configurable
from retrax.validation import ArgumentValueError

_ITEM, _END, _ERROR = 0, 1, 2
_POLL_S = 0.05


def _put(q, item, stop):
  """Puts `item` unless `stop` is set first; returns whether it was put."""
  while not stop.is_set():
    try:
      q.put(item, timeout=_POLL_S)
      return True
    except queue.Full:
      continue
  return False


def _produce(source, q, stop):
  iterator = None
  try:
    iterator = iter(source)
    for example in iterator:
      if not _put(q, (_ITEM, example), stop):
        return
    _put(q, (_END, None), stop)
  except BaseException as e:
    _put(q, (_ERROR, e), stop)
  finally:
    close = getattr(iterator, 'close', None)
    if close is not None and stop.is_set():
      try:
        close()
      except Exception:
        pass


def prefetch(source: Iterable[Any], n_prefetch: int = 2) -> Iterator[Any]:
  """Yields the examples of `source`, read up to `n_prefetch` ahead in a thread.

  The order is unchanged. An exception raised by `source` is re-raised here
  (same type and object, with a note naming the producer thread). Closing
  this generator (``.close()``, ``del``, or leaving a ``for`` loop and losing
  the reference) stops the producer thread at its next example.

  Args:
    source: iterable of examples (iterated only in the background thread).
    n_prefetch: how many examples may wait in the queue (>= 1).

  Yields:
    The examples of `source`.
  """
  if n_prefetch < 1:
    raise ArgumentValueError(f'n_prefetch must be >= 1, got {n_prefetch}.')
  q: queue.Queue[Any] = queue.Queue(maxsize=n_prefetch)
  stop = threading.Event()
  thread = threading.Thread(target=_produce, args=(source, q, stop),
                            name='retrax-data-prefetch', daemon=True)
  thread.start()
  try:
    while True:
      kind, value = q.get()
      if kind == _ITEM:
        yield value
      elif kind == _END:
        return
      else:
        if hasattr(value, 'add_note'):
          value.add_note('(raised in the input pipeline upstream of Prefetch, '
                         'in its producer thread)')
        raise value
  finally:
    stop.set()


@configurable('trax.data')
def Prefetch(n_prefetch: int = 2) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function prefetching in a background thread.

  Use it after the expensive steps (reading, tokenizing, batching), e.g.
  ``Serial(TextLines(path), Tokenize(...), Batch(8), Prefetch(4))``. Python
  threads overlap I/O and numpy/C-extension work (which release the GIL) with
  the training step; pure-Python stages still share one core.

  Args:
    n_prefetch: maximum number of examples read ahead (>= 1).
  """
  if n_prefetch < 1:
    raise ArgumentValueError(f'n_prefetch must be >= 1, got {n_prefetch}.')
  return lambda g: prefetch(g, n_prefetch)
