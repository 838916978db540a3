"""Stand-in for the parts of TensorFlow that Trax's tests use as helpers."""
import types

from tensorflow import _testing
from tensorflow import compat as compat

test = types.SimpleNamespace(TestCase=_testing.TestCase, main=_testing.main,
                             get_temp_dir=_testing.get_temp_dir)
io = types.SimpleNamespace(gfile=_testing.gfile)
gfile = _testing.gfile
