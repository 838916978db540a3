"""JSONL, TensorBoard event files (read back with our reader), progress bar, plot."""

import json
import struct

import pytest

from retrax.supervised import history
from retrax.supervised import metrics_log


def test_crc32c_and_record_framing_follow_the_tfrecord_spec():
  # The CRC-32C check value of the standard test vector "123456789".
  assert metrics_log.crc32c(b'123456789') == 0xE3069283
  record = metrics_log.frame_record(b'abc')
  assert struct.unpack('<Q', record[:8]) == (3,)
  crc = metrics_log.crc32c(record[:8])
  masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  assert struct.unpack('<I', record[8:12]) == (masked,)
  assert record[12:15] == b'abc'


def test_event_file_round_trip(tmp_path):
  writer = metrics_log.EventWriter(str(tmp_path))
  writer.scalar('metrics/loss', 2.5, 1)
  writer.scalar('metrics/loss', 0.125, 100)
  writer.scalar('image', [[1.0]], 100)  # Not a scalar: skipped.
  writer.close()
  assert 'tfevents' in writer.path
  events = metrics_log.read_events(writer.path)
  assert events[0]['file_version'] == 'brain.Event:2'
  assert [(e['step'], e['scalars']) for e in events[1:]] == [
      (1, [('metrics/loss', 2.5)]), (100, [('metrics/loss', 0.125)])]
  # The protobuf bytes of one event, field by field.
  data = metrics_log.encode_event(1.0, 7, scalars=[('a', 1.0)])
  assert data == (b'\x09' + struct.pack('<d', 1.0) + b'\x10\x07' +
                  b'\x2a\x0a' + b'\x0a\x08' + b'\x0a\x01a' + b'\x15' +
                  struct.pack('<f', 1.0))


def test_damaged_event_files_are_detected_and_truncated(tmp_path):
  writer = metrics_log.EventWriter(str(tmp_path))
  for step in (1, 2, 3):
    writer.scalar('x', float(step), step)
  writer.close()
  with open(writer.path, 'r+b') as f:
    f.truncate(f.seek(0, 2) - 3)  # A record cut short, as by a kill.
  with pytest.raises(ValueError, match='truncated record'):
    metrics_log.read_events(writer.path)
  metrics_log.truncate_event_file(writer.path, 1)
  assert [e['step'] for e in metrics_log.read_events(writer.path)] == [0, 1]


def test_jsonl_skips_torn_lines_and_truncates(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  writer = metrics_log.JsonlWriter(str(path))
  for step in (1, 2, 3):
    writer.write(step, 'train', 'metrics/loss', step / 10)
  writer.write(3, 'train', 'image', [1.0, 2.0])  # Not a scalar: skipped.
  writer.close()
  with open(path, 'a', encoding='utf-8') as f:
    f.write('{"step": 4, "mo')  # Torn by a kill.
  records = metrics_log.read_jsonl(str(path))
  assert [(r['step'], r['value']) for r in records] == [
      (1, 0.1), (2, 0.2), (3, 0.3)]
  writer.truncate(2)
  lines = path.read_text().splitlines()
  assert [json.loads(l)['step'] for l in lines] == [1, 2]


def test_progress_bar_is_quiet_off_a_terminal(capsys):
  bar = metrics_log.ProgressBar(1000)  # stderr is captured: not a TTY.
  bar.update(10, 1.0)
  bar.write('hello')
  bar.close()
  captured = capsys.readouterr()
  assert captured.out == 'hello\n' and captured.err == ''
  shown = metrics_log.ProgressBar(3, enabled=True)
  for _ in range(3):
    shown.update(80, 0.5)
  shown.close()
  assert '0/3 [' in capsys.readouterr().err  # Drawn (then cleared at close).


def test_history_api_and_json_round_trip():
  h = history.History()
  h.append('train', 'metrics/accuracy', 1, 0.04)
  h.append('train', 'metrics/accuracy', 1000, 0.31)
  h.append('eval', 'metrics/loss', 1000, 2.0)
  assert h.get('train', 'metrics/accuracy') == [(1, 0.04), (1000, 0.31)]
  assert h.get('nope', 'x') == [] and h.get('train', 'nope') == []
  assert h.modes == ['eval', 'train']
  assert h.metrics_for_mode('train') == ['metrics/accuracy']
  again = history.History.from_dict(json.loads(json.dumps(h.to_dict())))
  assert again == h
  again.truncate(1)
  assert again.get('train', 'metrics/accuracy') == [(1, 0.04)]


def test_plot_metrics_writes_a_png(tmp_path):
  pytest.importorskip('matplotlib')
  from retrax.app import plot
  writer = metrics_log.JsonlWriter(str(tmp_path / 'metrics.jsonl'))
  for step in (1, 10, 20):
    writer.write(step, 'train', 'metrics/loss', 1.0 / step)
    writer.write(step, 'eval', 'metrics/loss', 1.2 / step)
  writer.close()
  path = plot.plot_metrics(str(tmp_path))
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert plot.load_metrics(str(tmp_path))['metrics/loss']['eval'] == (
      [1, 10, 20], [1.2, 0.12, 0.06])
  with pytest.raises(ValueError, match='No data'):
    plot.plot_metrics(str(tmp_path), metrics=['metrics/nope'])
  with pytest.raises(FileNotFoundError):
    plot.plot_metrics(str(tmp_path / 'missing'))
