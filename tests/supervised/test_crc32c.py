"""CRC-32C of the TensorBoard writer against published vectors and a bitwise reference."""

import struct

import numpy as np
import pytest

from retrax.supervised import metrics_log


def _bitwise_crc32c(data):
  """Reflected CRC-32C, one bit at a time (polynomial 0x82F63B78)."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


# RFC 3720 (iSCSI), appendix B.4; the stored little-endian bytes read as uint32.
_ISCSI_READ_PDU = bytes([
    0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00])


@pytest.mark.parametrize('data,stored', [
    (bytes(32), b'\xaa\x36\x91\x8a'),
    (b'\xff' * 32, b'\x43\xab\xa8\x62'),
    (bytes(range(32)), b'\x4e\x79\xdd\x46'),
    (bytes(range(31, -1, -1)), b'\x5c\xdb\x3f\x11'),
    (_ISCSI_READ_PDU, b'\x56\x3a\x96\xd9'),
])
def test_rfc3720_vectors(data, stored):
  assert metrics_log.crc32c(data) == struct.unpack('<I', stored)[0]


def test_check_value_empty_and_random_against_bitwise_reference():
  assert metrics_log.crc32c(b'123456789') == 0xE3069283
  assert metrics_log.crc32c(b'') == 0
  rng = np.random.default_rng(0)
  for n in (1, 7, 64, 1000):
    data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    assert metrics_log.crc32c(data) == _bitwise_crc32c(data)
    assert metrics_log.crc32c(bytearray(data)) == _bitwise_crc32c(data)


def test_masked_crc_matches_the_tfrecord_rule():
  data = b'tensorboard'
  crc = _bitwise_crc32c(data)
  want = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  assert metrics_log.masked_crc32c(data) == want


def test_large_payload_is_fast():
  # A per-byte Python loop takes seconds on 8 MiB; the library takes milliseconds.
  import time
  data = bytes(8 << 20)
  t0 = time.perf_counter()
  metrics_log.crc32c(data)
  assert time.perf_counter() - t0 < 0.5


def test_without_the_package_the_python_table_gives_the_same_values(
    monkeypatch):
  monkeypatch.setattr(metrics_log, 'google_crc32c', None)
  assert metrics_log.crc32c(b'123456789') == 0xE3069283
  assert metrics_log.crc32c(_ISCSI_READ_PDU) == struct.unpack(
      '<I', b'\x56\x3a\x96\xd9')[0]
  data = np.random.default_rng(1).integers(0, 256, 300, np.uint8).tobytes()
  assert metrics_log.crc32c(data) == _bitwise_crc32c(data)
