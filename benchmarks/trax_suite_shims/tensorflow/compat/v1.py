import types
from tensorflow import _testing
test = types.SimpleNamespace(TestCase=_testing.TestCase, main=_testing.main,
                             get_temp_dir=_testing.get_temp_dir)
gfile = _testing.gfile
io = types.SimpleNamespace(gfile=_testing.gfile)
