"""Where training metrics go: JSONL, TensorBoard event files, a progress bar.

* `JsonlWriter`: one JSON object per line in `output_dir/metrics.jsonl`,
  `{"step": 100, "mode": "eval", "metric": "metrics/Accuracy", "value": 0.9,
  "time": 1700000000.0}`. On resume the file is cut back to the restored step,
  so after any number of restarts it reads like an uninterrupted run's.
* `EventWriter` / `read_events`: TensorBoard's `events.out.tfevents.*` files,
  written without TensorFlow. Each record is
  `uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`
  where `data` is a serialized `tensorflow.Event` protobuf (wall_time = 1,
  step = 2, file_version = 3, summary = 5; `Summary.Value` has tag = 1 and
  simple_value = 2). TensorBoard reads these files as written by TensorFlow.
* `ProgressBar`: the console bar, now `progress.Progress`.
"""

import json
import math
import os
import socket
import struct
import time

import numpy as np

try:  # A declared dependency, but absent where installed with --no-deps.
  import google_crc32c
except ImportError:
  google_crc32c = None  # type: ignore[assignment]  # crc32c() falls back.

from retrax.checkpoints import ownership
from retrax.checkpoints.atomic import append
from retrax.checkpoints.atomic import atomic_write
from retrax.errors import UserInputError
from retrax.run_layout import EVENTS_PREFIX
from retrax.run_layout import RUN_FILES
from retrax.supervised import progress

_RUN_FILES_FORMAT = 'retrax-run-files'


# --- which files are the run's -------------------------------------------------


class RunFiles:
  """The log files (paths relative to `output_dir`) that runs there created.

  A file is claimed (recorded, atomically) before it is created, so the list
  holds every log file the runs wrote, and nothing else. Every entry must lie
  inside `output_dir` (`ownership.check_entry`): a crafted `../x` or absolute
  path is refused, never opened.
  """

  def __init__(self, output_dir):
    self._dir = output_dir
    self._path = os.path.join(output_dir, RUN_FILES)
    self._files = []
    self.existed = os.path.exists(self._path)
    if self.existed:
      self._files = self._read()

  def _read(self):
    try:
      with open(self._path, 'rb') as f:
        doc = json.loads(f.read().decode('utf-8'))
    except (OSError, ValueError, RecursionError) as e:  # Bad UTF-8 or JSON.
      raise UserInputError(f'{self._path}: unreadable ({e}); it lists the log '
                           'files of the run in this directory.') from None
    files = doc.get('files') if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or doc.get('format') != _RUN_FILES_FORMAT or
        not isinstance(files, list)):
      raise UserInputError(f'{self._path} is not a retrax {RUN_FILES} file.')
    return [ownership.check_entry(self._dir, f, self._path) for f in files]

  def owns(self, relpath):
    return os.path.normpath(relpath) in self._files

  def files(self):
    """Absolute paths of the claimed files."""
    return [os.path.join(self._dir, f) for f in self._files]

  def claim(self, relpath):
    """Records `relpath` as the run's (before the caller creates it)."""
    relpath = os.path.normpath(relpath)
    if relpath in self._files:
      return
    self._files.append(relpath)
    doc = {'format': _RUN_FILES_FORMAT, 'version': 1, 'files': self._files}
    with atomic_write(self._path) as f:
      f.write((json.dumps(doc, indent=1) + '\n').encode('utf-8'))
    self.existed = True


# --- JSONL ---------------------------------------------------------------------


def read_jsonl(path):
  """Returns the records of a metrics JSONL file; a torn last line is skipped."""
  records: list = []
  if not os.path.exists(path):
    return records
  with open(path, 'rb') as f:
    for line in f:
      try:
        records.append(json.loads(line.decode('utf-8')))
      except (UnicodeDecodeError, json.JSONDecodeError):
        continue  # A line cut short by a kill.
  return records


class JsonlWriter:
  """Appends metric records to a JSON-lines file.

  Records are held until `flush` (or `close`) appends them, all or none
  (`atomic.append`: a full disk leaves no torn line); no file stays open in
  between, so a writer that is never closed leaks nothing. With
  `on_create`, that is called (with the path) before the file is first
  written (e.g. `RunFiles.claim`).
  """

  def __init__(self, path, on_create=None):
    self._path = path
    self._pending = []
    self._on_create = on_create

  @property
  def path(self):
    return self._path

  def truncate(self, last_step):
    """Keeps only the well-formed records with `step <= last_step` (atomically)."""
    self.flush()
    if not os.path.exists(self._path):
      return
    kept = [r for r in read_jsonl(self._path)
            if isinstance(r, dict) and r.get('step', math.inf) <= last_step]
    with atomic_write(self._path) as f:
      for record in kept:
        f.write((json.dumps(record) + '\n').encode('utf-8'))

  def write(self, step, mode, metric, value):
    """Appends one record (scalars only; other values are skipped)."""
    if np.ndim(value) != 0:
      return
    record = {'step': int(step), 'mode': mode, 'metric': metric,
              'value': float(value), 'time': time.time()}
    self._pending.append(json.dumps(record) + '\n')

  def flush(self):
    """Appends the records written since the last flush."""
    if not self._pending:
      return
    if self._on_create is not None:
      self._on_create(self._path)
      self._on_create = None
    append(self._path, ''.join(self._pending).encode('utf-8'))
    self._pending = []

  close = flush


# --- TensorBoard event files ------------------------------------------------------


def _crc32c_table():
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


def crc32c(data):
  """CRC-32C (Castagnoli), as TFRecord framing uses (the `google-crc32c` package).

  Without that package (a machine where retrax was installed with --no-deps
  and no network, say) a table-driven Python loop gives the same value; event
  records are small, so its speed does not matter.
  """
  if google_crc32c is not None:
    return google_crc32c.value(bytes(data))
  crc = 0xFFFFFFFF
  for byte in bytes(data):
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


_CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data):
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
  if n < 0:
    n += 1 << 64
  out = bytearray()
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _field(number, wire_type):
  return _varint((number << 3) | wire_type)


def _length_delimited(number, payload):
  return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(wall_time, step, file_version=None, scalars=None):
  """Serializes a `tensorflow.Event` holding a file version or scalar values."""
  out = _field(1, 1) + struct.pack('<d', wall_time)
  out += _field(2, 0) + _varint(int(step))
  if file_version is not None:
    out += _length_delimited(3, file_version.encode('utf-8'))
  if scalars:
    summary = b''
    for tag, value in scalars:
      value_msg = (_length_delimited(1, tag.encode('utf-8')) +
                   _field(2, 5) + struct.pack('<f', float(value)))
      summary += _length_delimited(1, value_msg)
    out += _length_delimited(5, summary)
  return out


def frame_record(data):
  """Frames bytes as one TFRecord."""
  header = struct.pack('<Q', len(data))
  return (header + struct.pack('<I', masked_crc32c(header)) + data +
          struct.pack('<I', masked_crc32c(data)))


class EventWriter:
  """Writes scalar summaries to a new TensorBoard event file in `log_dir`.

  Like `JsonlWriter`, it appends on `flush` and holds no open file. With
  `on_create`, that is called (with the path) before the file is made.
  """

  def __init__(self, log_dir, on_create=None):
    os.makedirs(log_dir, exist_ok=True)
    name = (f'{EVENTS_PREFIX}{int(time.time())}.{socket.gethostname()}.'
            f'{os.getpid()}.retrax')
    self._path = os.path.join(log_dir, name)
    if on_create is not None:
      on_create(self._path)
    self._pending = [frame_record(
        encode_event(time.time(), 0, file_version='brain.Event:2'))]
    self.flush()

  @property
  def path(self):
    return self._path

  def scalar(self, tag, value, step):
    """Records one scalar under `tag` at `step` (non-scalars are skipped)."""
    if np.ndim(value) != 0:
      return
    self._pending.append(frame_record(
        encode_event(time.time(), step, scalars=[(tag, float(value))])))

  def flush(self):
    """Appends the events recorded since the last flush."""
    if self._pending:
      append(self._path, b''.join(self._pending))
      self._pending = []

  close = flush


def _read_varint(buf, pos):
  result, shift = 0, 0
  while True:
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return result, pos


def _parse_message(buf):
  """Yields `(field_number, wire_type, value)` of a protobuf message."""
  pos = 0
  while pos < len(buf):
    key, pos = _read_varint(buf, pos)
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      value, pos = _read_varint(buf, pos)
    elif wire_type == 1:
      value, pos = buf[pos:pos + 8], pos + 8
    elif wire_type == 2:
      length, pos = _read_varint(buf, pos)
      value, pos = buf[pos:pos + length], pos + length
    elif wire_type == 5:
      value, pos = buf[pos:pos + 4], pos + 4
    else:
      raise UserInputError(f'Unsupported protobuf wire type {wire_type}.')
    yield number, wire_type, value


def decode_event(data):
  """Parses a serialized Event into a dict: wall_time, step, file_version, scalars."""
  event: dict = {'wall_time': None, 'step': 0, 'file_version': None, 'scalars': []}
  for number, _, value in _parse_message(data):
    if number == 1:
      event['wall_time'] = struct.unpack('<d', value)[0]
    elif number == 2:
      event['step'] = value - (1 << 64) if value >= 1 << 63 else value
    elif number == 3:
      event['file_version'] = value.decode('utf-8')
    elif number == 5:
      for v_number, _, v_value in _parse_message(value):
        if v_number != 1:
          continue
        tag, simple = None, None
        for f_number, _, f_value in _parse_message(v_value):
          if f_number == 1:
            tag = f_value.decode('utf-8')
          elif f_number == 2:
            simple = struct.unpack('<f', f_value)[0]
        event['scalars'].append((tag, simple))
  return event


def read_events(path):
  """Reads an event file back, checking every CRC; returns a list of event dicts.

  Raises:
    ValueError: a truncated record or a CRC mismatch (naming the offset).
  """
  with open(path, 'rb') as f:
    buf = f.read()
  events, pos = [], 0
  while pos < len(buf):
    if pos + 12 > len(buf):
      raise UserInputError(f'{path}: truncated record header at byte {pos}.')
    header = buf[pos:pos + 8]
    (length,) = struct.unpack('<Q', header)
    (header_crc,) = struct.unpack('<I', buf[pos + 8:pos + 12])
    if header_crc != masked_crc32c(header):
      raise UserInputError(f'{path}: length CRC mismatch at byte {pos}.')
    start, end = pos + 12, pos + 12 + length
    if end + 4 > len(buf):
      raise UserInputError(f'{path}: truncated record at byte {pos}.')
    data = buf[start:end]
    (data_crc,) = struct.unpack('<I', buf[end:end + 4])
    if data_crc != masked_crc32c(data):
      raise UserInputError(f'{path}: data CRC mismatch at byte {pos}.')
    events.append(decode_event(data))
    pos = end + 4
  return events


def truncate_event_file(path, last_step):
  """Rewrites an event file keeping its records up to `last_step` (atomically).

  Reading stops at the first damaged record (e.g. one cut short by a kill).
  """
  with open(path, 'rb') as f:
    buf = f.read()
  kept, pos, changed = [], 0, False
  while pos < len(buf):
    header = buf[pos:pos + 8]
    end = pos + 12 + (struct.unpack('<Q', header)[0] if len(header) == 8 else 0)
    data = buf[pos + 12:end]
    if (len(header) < 8 or end + 4 > len(buf) or
        struct.unpack('<I', buf[pos + 8:pos + 12])[0] != masked_crc32c(header)
        or struct.unpack('<I', buf[end:end + 4])[0] != masked_crc32c(data)):
      changed = True  # A torn or damaged tail: dropped.
      break
    event = decode_event(data)
    if event['step'] <= last_step or event['file_version'] is not None:
      kept.append(buf[pos:end + 4])
    else:
      changed = True
    pos = end + 4
  if changed:
    with atomic_write(path) as f:
      f.write(b''.join(kept))


# --- the progress bar ---------------------------------------------------------------


# The bar moved to `progress.Progress` (compile notice, one rate, ETA).
ProgressBar = progress.Progress
