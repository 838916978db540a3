"""benchmarks/reversible_memory.py: the reversible stack's memory is flat in depth."""

import json
from tests import benchmark_scripts

reversible_memory = benchmark_scripts.load('reversible_memory')


def _temp_bytes(kind, depth, capsys):
  # One block's weights (2 x 2 x 32 x 256 floats, 128 KiB) are 16 times one
  # d_ff activation (16 x 256): restacked weights would show at once.
  reversible_memory._worker(kind, depth, d_model=32, d_ff=256, length=16,
                            batch=1)
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])[
      'temp_bytes']


def test_reversible_temps_are_flat_in_depth_and_plain_ones_grow(capsys):
  """The worker passes the weights as held: with Trax's per-layer tree the
  program restacked them and the reversible temps grew by the weights."""
  reversible = [_temp_bytes('reversible', n, capsys) for n in (2, 8)]
  plain = [_temp_bytes('plain', n, capsys) for n in (2, 8)]
  assert reversible[1] <= 1.15 * reversible[0], reversible
  assert plain[1] >= 1.8 * plain[0], plain
