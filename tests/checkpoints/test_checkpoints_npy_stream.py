"""Tests for Trax's `.npy.gz` array streams."""

import gzip

import ml_dtypes
import numpy as np
import pytest

from checkpoint_testlib import LOOP_MODELS
from retrax.checkpoints import npy_stream
from retrax.checkpoints.errors import CheckpointCorruptedError


def _trax_np_from_file(path):
  """Trax's `np_from_file`, re-stated: np.load until it fails."""
  out = []
  with gzip.open(path, 'rb') as f:
    while True:
      try:
        out.append(np.load(f, allow_pickle=False))
      except Exception:
        break
  return out


@pytest.mark.parametrize('model', LOOP_MODELS)
@pytest.mark.parametrize('kind', ['weights', 'opt_slots0'])
def test_golden_files_match_trax_reader(golden, model, kind):
  path = golden / model / f'model.{kind}.npy.gz'
  ours = npy_stream.read_npy_gz(path)
  ref = _trax_np_from_file(path)
  assert len(ours) == len(ref) > 0
  for a, b in zip(ours, ref):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def test_round_trip_and_bfloat16_bits(tmp_path):
  bf = np.array([[1.0, -0.5], [3.25, 1e-3]], dtype=ml_dtypes.bfloat16)
  arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), bf,
            np.array(7, np.int32), np.zeros((0,), np.float16)]
  path = tmp_path / 'w.npy.gz'
  npy_stream.write_npy_gz(path, arrays)
  back = npy_stream.read_npy_gz(path)
  assert back[1].dtype == np.uint16  # Stored bit-cast, as Trax does.
  assert back[1].tobytes() == bf.tobytes()
  restored = npy_stream.from_bits(back)
  for a, b in zip(restored, arrays):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()
  # Trax's own reading loop sees the same records.
  assert len(_trax_np_from_file(path)) == 4


def test_truncated_stream_is_detected(golden, tmp_path):
  data = (golden / 'reformerlm_copy' / 'model.weights.npy.gz').read_bytes()
  path = tmp_path / 'cut.npy.gz'
  path.write_bytes(data[:len(data) * 2 // 3])
  with pytest.raises(CheckpointCorruptedError, match='truncated'):
    npy_stream.read_npy_gz(path)


def test_missing_file():
  with pytest.raises(FileNotFoundError):
    npy_stream.read_npy_gz('/nonexistent/model.weights.npy.gz')
