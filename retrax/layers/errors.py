"""`LayerError` and where layers were made: errors that name a layer's path.

A failure inside a network is raised as a `LayerError` naming the failing
layer's path (`Serial[1] > Branch[0] > Dense_3`), where that layer was
created, and the input signature it was given.
"""

import contextlib
import inspect
import os
import traceback

from retrax.errors import Error
from retrax.errors import InputValueError
from retrax.shapes import signature

_LAYERS_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_LAYERS_DIR)


class LayerError(Error):
  """An error in a layer, naming the layer's path, creation site and input signature.

  The path runs from the outermost layer to the failing one, e.g.
  `Serial[1] > Branch[0] > Dense_3`: sublayer 1 of a Serial is a Branch whose
  branch 0 is the Dense layer that failed. The message then says where that
  layer was created, what signature it was given and what went wrong
  (expected vs. got).

  It wraps any exception, a bug too (its `__cause__`): `retrax.errors.
  deliberate` tells the two apart.
  """

  wraps_cause = True

  def __init__(self, layer_name, function_name, caller, input_signature,
               traceback_string, details=''):
    self._path = [layer_name]
    self._function_name = function_name
    self._caller = caller
    self._input_signature = input_signature
    self._traceback = traceback_string
    self._details = details
    super().__init__(self.message)

  def prepend(self, parent):
    """Adds a parent path element (e.g. `Serial[1]`) and refreshes the message."""
    self._path.insert(0, parent)
    self.args = (self.message,)

  @property
  def path(self):
    """The layer path, e.g. `'Serial[1] > Dense_3'`."""
    return ' > '.join(self._path)

  @property
  def layer_name(self):
    """Name of the (innermost) layer that failed."""
    return self._path[-1]

  @property
  def input_signature(self):
    """Signature of the inputs the failing layer was given."""
    return self._input_signature

  @property
  def message(self):
    caller = self._caller or {'filename': '?', 'lineno': 0}
    parts = [p for p in caller['filename'].split(os.sep) if p]
    short = '[...]/' + '/'.join(parts[-3:])
    msg = (f'Exception passing through layer {self.path} '
           f'(in {self._function_name}):\n'
           f'  layer created in file {short}, line {caller["lineno"]}\n'
           f'  layer input shapes: {self._input_signature}\n')
    if self._details:
      msg += f'\n  {self._details}\n'
    return msg + '\n' + self._traceback


def find_caller():
  """Returns file and line of the first frame outside retrax.layers/models."""
  frame = inspect.currentframe()
  while frame is not None:
    fname = os.path.abspath(frame.f_code.co_filename)
    if not (fname.startswith(_LAYERS_DIR) or
            fname.startswith(os.path.join(_PACKAGE_DIR, 'models'))):
      break
    frame = frame.f_back
  if frame is None:
    return {'filename': '?', 'lineno': 0}
  caller = {'filename': frame.f_code.co_filename, 'lineno': frame.f_lineno}
  del frame
  return caller


def short_traceback(exc):
  """The exception's type and message, without JAX's traceback-filtering note."""
  info = traceback.TracebackException(type(exc), exc, None, compact=True)
  if info.__notes__:
    info.__notes__ = [n for n in info.__notes__
                      if 'JAX has removed its internal frames' not in n]
  return ''.join(info.format_exception_only()).rstrip()


@contextlib.contextmanager
def in_sublayer(parent, index):
  """Context in which a sublayer's LayerError gains `parent[index]` in its path.

  The element is `parent.path_element(index)`; a combinator built from
  others (e.g. `Branch`) may rename it or, returning None, leave it out.
  """
  try:
    yield
  except LayerError as e:
    element = parent.path_element(index)
    if element is not None:
      e.prepend(element)
    raise


def input_error(layer, function_name, inputs, message):
  """A LayerError for `layer` given `inputs`, caused by an `InputValueError`
  saying `message`."""
  cause = InputValueError(message)
  error = LayerError(layer.name, function_name, layer.caller, signature(inputs),
                     short_traceback(cause))
  error.__cause__ = cause
  return error
