"""Training metrics at `log_every` steps, and reporters (W&B, MLflow, any object).

The reporters are checked against fakes with the libraries' API in every
run, and against the real libraries in their offline modes where they are
installed (`pip install "retrax[wandb,mlflow]"`; skipped otherwise).
"""

import importlib.util
import json
import re
import sys
import time
import types

import numpy as np
import pytest

import supervised_toys as toys
from retrax import optimizers
from retrax.errors import MissingPackageError
from retrax.errors import UserInputError
from retrax.supervised import metrics_log
from retrax.supervised import reporters
from retrax.supervised import training

LOSS = 'metrics/WeightedCrossEntropy'


def _loop(output_dir=None, seed=0, **kwargs):
  task = training.TrainTask(toys.copy_batches(seed),
                            toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05), n_steps_per_checkpoint=10)
  evals = training.EvalTask(
      toys.copy_batches(seed + 100),
      [toys.WeightedCrossEntropy(), toys.WeightedAccuracy()], n_eval_batches=1)
  return training.Loop(toys.mlp(), task, eval_tasks=evals,
                       output_dir=output_dir, random_seed=seed,
                       write_trax_files=False, **kwargs)


def _records(output_dir):
  return [(r['step'], r['mode'], r['metric'], r['value'])
          for r in metrics_log.read_jsonl(output_dir / 'metrics.jsonl')]


def _train_losses(output_dir):
  return [(s, v) for s, mode, m, v in _records(output_dir)
          if mode == 'train' and m == LOSS]


def test_log_every_logs_mean_training_loss_between_evals(tmp_path, capsys):
  every_step = _loop(tmp_path / 'every', log_every=1)
  every_step.run(20)
  per_step = dict(_train_losses(tmp_path / 'every'))
  assert sorted(per_step) == list(range(1, 21))
  capsys.readouterr()
  loop = _loop(tmp_path / 'run', log_every=3)
  loop.run(20)
  out = capsys.readouterr().out
  logged = _train_losses(tmp_path / 'run')
  # Evals at 1, 10, 20; training logs at 1 and every 3 steps between.
  assert [s for s, _ in logged] == [1, 3, 6, 9, 10, 12, 15, 18, 20]
  previous = 0
  for step, value in logged:  # Each is the mean loss since the last log.
    expected = np.mean([per_step[s] for s in range(previous + 1, step + 1)])
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    previous = step
  # TensorBoard holds the same points; stdout only those of eval steps.
  (event_file,) = (tmp_path / 'run' / 'train').iterdir()
  tb = [(e['step'], s[1]) for e in metrics_log.read_events(event_file)[1:]
        for s in e['scalars'] if s[0] == LOSS]
  np.testing.assert_allclose(tb, logged, rtol=1e-6)
  printed = re.findall(r'Step +(\d+): train +WeightedCrossEntropy', out)
  assert printed == ['1', '10', '20']
  rates = [s for s, mode, m, _ in _records(tmp_path / 'run')
           if m == 'training/steps per second']
  assert rates == [s for s, _ in logged]
  assert loop.history.get('train', LOSS) == logged


def test_log_every_must_be_a_positive_int():
  for bad in (0, -5, 2.5, '10', True):
    with pytest.raises(UserInputError, match='log_every must be an int >= 1'):
      _loop(log_every=bad)


class _Recorder:
  """A reporter object: what any `report_to` entry must offer."""

  def __init__(self):
    self.records, self.flushed, self.closed = [], 0, False

  def record(self, step, mode, name, value):
    self.records.append((step, mode, name, float(value)))

  def flush(self):
    self.flushed += 1

  def close(self):
    self.closed = True


def test_a_reporter_object_gets_what_metrics_jsonl_gets(tmp_path):
  recorder = _Recorder()
  loop = _loop(tmp_path, log_every=4, report_to=[recorder])
  loop.run(10)
  assert recorder.records == _records(tmp_path)
  assert {m for _, _, m, _ in recorder.records} >= {
      LOSS, 'metrics/WeightedAccuracy', 'training/learning_rate'}
  assert recorder.flushed >= 4 and not recorder.closed
  loop.run(2)  # The same reporter goes on (a notebook's next cell).
  assert recorder.records == _records(tmp_path)
  loop.close_reporters()
  assert recorder.closed


# --- fakes with the libraries' API ---------------------------------------------


class _FakeWandbRun:

  def __init__(self, **kwargs):
    self.init_kwargs, self.logged, self.finished = kwargs, [], False

  def log(self, data, step=None):
    self.logged.append((step, dict(data)))

  def finish(self):
    self.finished = True


def _fake_wandb():
  wandb = types.ModuleType('wandb')
  wandb.runs = []

  def init(**kwargs):
    wandb.runs.append(_FakeWandbRun(**kwargs))
    return wandb.runs[-1]
  wandb.init = init
  return wandb


def _by_step(records):
  """`{step: {'<mode>/<metric>': value}}` of jsonl records."""
  out = {}
  for step, mode, metric, value in records:
    out.setdefault(step, {})[f'{mode}/{metric}'] = value
  return out


def _merged(logged):
  out = {}
  for step, data in logged:
    out.setdefault(step, {}).update(data)
  return out


def test_report_to_wandb_logs_every_metric_by_step(tmp_path, monkeypatch):
  wandb = _fake_wandb()
  monkeypatch.setitem(sys.modules, 'wandb', wandb)
  loop = _loop(tmp_path / 'my-run', log_every=5, report_to='wandb')
  loop.run(10)
  (run,) = wandb.runs
  assert run.init_kwargs == {'name': 'my-run', 'config': None}
  steps = [step for step, _ in run.logged]
  assert steps == sorted(steps)  # W&B needs steps in order.
  assert _merged(run.logged) == _by_step(_records(tmp_path / 'my-run'))
  assert not run.finished
  loop.close_reporters()
  assert run.finished


class _FakeMlflow(types.ModuleType):
  """mlflow's fluent API, as far as the reporter uses it."""

  def __init__(self, active=None):
    super().__init__('mlflow')
    self.active, self.started, self.ended = active, [], 0
    self.metrics, self.params = [], {}

  def active_run(self):
    return self.active

  def start_run(self, run_name=None):
    self.active = types.SimpleNamespace(info=types.SimpleNamespace(
        run_id=f'run-{len(self.started)}'))
    self.started.append(run_name)
    return self.active

  def log_metrics(self, metrics, step=None):
    assert self.active is not None
    self.metrics.append((step, dict(metrics)))

  def log_params(self, params):
    self.params.update(params)

  def end_run(self):
    self.active = None
    self.ended += 1


def test_report_to_mlflow_logs_to_a_new_run(tmp_path, monkeypatch):
  mlflow = _FakeMlflow()
  monkeypatch.setitem(sys.modules, 'mlflow', mlflow)
  loop = _loop(tmp_path / 'r1', log_every=5, report_to='mlflow')
  loop.run(10)
  assert mlflow.started == ['r1']
  assert _merged(mlflow.metrics) == _by_step(_records(tmp_path / 'r1'))
  loop.close_reporters()
  assert mlflow.ended == 1 and mlflow.active is None


def test_mlflow_reporter_joins_an_active_run_and_leaves_it_open(monkeypatch):
  users_run = types.SimpleNamespace(info=types.SimpleNamespace(run_id='mine'))
  mlflow = _FakeMlflow(active=users_run)
  monkeypatch.setitem(sys.modules, 'mlflow', mlflow)
  reporter = reporters.MlflowReporter(run_name='x', config={'d_model': 64})
  assert reporter.run_id == 'mine' and mlflow.started == []
  assert mlflow.params == {'d_model': 64}
  reporter.record(3, 'train', LOSS, np.float32(2.5))
  reporter.record(1, 'eval', 'metrics/A', 0.5)
  reporter.record(1, 'train', 'metrics/nan', float('nan'))  # Not sent.
  reporter.close()
  assert mlflow.metrics == [(1, {'eval/metrics/A': 0.5}),
                            (3, {f'train/{LOSS}': 2.5})]
  assert mlflow.ended == 0 and mlflow.active is users_run


@pytest.mark.parametrize('name', ['wandb', 'mlflow'])
def test_missing_library_is_one_line_naming_the_extra(name, monkeypatch):
  monkeypatch.setitem(sys.modules, name, None)  # Not installed.
  with pytest.raises(MissingPackageError) as e:
    reporters.make(name)
  message = str(e.value)
  assert '\n' not in message and isinstance(e.value, ImportError)
  assert f"report_to='{name}'" in message
  assert f'pip install "retrax[{name}]"' in message


def test_unknown_reporter_name_fails_before_any_work():
  with pytest.raises(UserInputError, match="unknown reporter 'tensorbord'"):
    _loop(report_to='wandb,tensorbord')
  assert reporters.parse(None) == [] and reporters.parse('') == []
  assert reporters.parse(' wandb , mlflow') == ['wandb', 'mlflow']


# --- the real libraries, offline ----------------------------------------------


def _installed(name):
  return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(not _installed('mlflow'), reason='mlflow not installed')
def test_real_mlflow_file_store_holds_the_jsonl_values(tmp_path, monkeypatch):
  import mlflow
  monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')  # MLflow >= 3.x.
  monkeypatch.setenv('MLFLOW_TRACKING_URI', (tmp_path / 'mlruns').as_uri())
  mlflow.set_tracking_uri((tmp_path / 'mlruns').as_uri())
  loop = _loop(tmp_path / 'run', log_every=5, report_to='mlflow')
  loop.run(10)
  loop.close_reporters()
  client = mlflow.tracking.MlflowClient()
  (run,) = client.search_runs(experiment_ids=['0'])
  assert run.info.run_name == 'run' and run.info.status == 'FINISHED'
  expected = _by_step(_records(tmp_path / 'run'))
  got = {}
  for key in run.data.metrics:
    for m in client.get_metric_history(run.info.run_id, key):
      got.setdefault(m.step, {})[key] = m.value
  assert got.keys() == expected.keys()
  for step in expected:
    assert got[step].keys() == expected[step].keys()
    np.testing.assert_allclose([got[step][k] for k in sorted(got[step])],
                               [expected[step][k] for k in sorted(got[step])],
                               rtol=1e-12)


def _wandb_history(path):
  """`{step: {key: value}}` of the history records in a `.wandb` file, and
  whether it holds the run's exit record.

  The file is W&B's record log (LevelDB's format: 32 KiB blocks of records
  with a 7-byte header, after the file's own 7-byte ':W&B' header), each
  record a `wandb_internal_pb2.Record`.
  """
  from wandb.proto import wandb_internal_pb2
  data = path.read_bytes()
  assert data[:4] in (b':W&B', b'')
  history, pos, payload, block, ended = {}, 7, b'', 32768, False
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # A block's padded tail.
      pos += block - pos % block
      continue
    length, kind = int.from_bytes(data[pos + 4:pos + 6], 'little'), data[pos + 6]
    payload += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # A full record, or the last piece of one.
      record = wandb_internal_pb2.Record.FromString(payload)
      payload = b''
      ended = ended or record.WhichOneof('record_type') == 'exit'
      if record.WhichOneof('record_type') == 'history':
        items = {(i.key or '/'.join(i.nested_key)): json.loads(i.value_json)
                 for i in record.history.item}
        history.setdefault(items['_step'], {}).update(
            {k: v for k, v in items.items() if not k.startswith('_')})
  return history, ended


@pytest.mark.skipif(not _installed('wandb'), reason='wandb not installed')
def test_real_wandb_offline_run_records_the_jsonl_values(tmp_path, monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  loop = _loop(tmp_path / 'run', log_every=5, report_to='wandb')
  loop.run(10)
  loop.close_reporters()
  (log,) = (tmp_path / 'wandb').glob('offline-run-*/run-*.wandb')
  expected = _by_step(_records(tmp_path / 'run'))
  deadline = time.time() + 60  # W&B's service writes the file after finish().
  history, ended = _wandb_history(log)
  while not ended and time.time() < deadline:
    time.sleep(0.5)
    history, ended = _wandb_history(log)
  assert ended
  assert history.keys() == expected.keys()
  for step, values in expected.items():
    assert history[step] == pytest.approx(values, rel=1e-12), step
