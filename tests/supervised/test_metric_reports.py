"""Training metrics at `log_every` steps, and reporters (W&B, MLflow, any
object), from a `Loop` and from `retrax train --log_every --report_to`.

The reporters are checked against fakes with the libraries' API in every
run, and against the real libraries in their offline modes where they are
installed (`pip install "retrax[wandb,mlflow]"`; skipped otherwise, as in
CI): the metrics read back from their stores equal metrics.jsonl's.
"""

import collections
import importlib.util
import json
import os
import re
import sys
import time
import types

import numpy as np
import pytest

import supervised_toys as toys
from retrax.app import cli
from retrax import optimizers
from retrax.errors import MissingPackageError
from retrax.errors import UserInputError
from retrax.supervised import metrics_log
from retrax.supervised import reporters
from retrax.supervised import training
from retrax.validation import ArgumentError

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
                       options=training.LoopOptions(write_trax_files=False,
                                                    **kwargs))


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
    with pytest.raises(ArgumentError, match='log_every must be an int >= 1'):
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


class _FakeWandbError(Exception):
  """`wandb.errors.Error`, the base of W&B's errors."""


def _fake_wandb(monkeypatch, fails=None):
  """A `wandb` module (its `init` raising `fails`, if given) in sys.modules."""
  wandb = types.ModuleType('wandb')
  wandb.runs = []
  errors = types.ModuleType('wandb.errors')
  errors.Error = _FakeWandbError

  def init(**kwargs):
    if fails is not None:
      raise fails
    wandb.runs.append(_FakeWandbRun(**kwargs))
    return wandb.runs[-1]
  wandb.init, wandb.errors = init, errors
  monkeypatch.setitem(sys.modules, 'wandb', wandb)
  monkeypatch.setitem(sys.modules, 'wandb.errors', errors)
  monkeypatch.delenv('WANDB_DIR', raising=False)
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
  wandb = _fake_wandb(monkeypatch)
  loop = _loop(tmp_path / 'my-run', log_every=5, report_to='wandb')
  loop.run(10)
  (run,) = wandb.runs
  # W&B's files go into the run directory, not the working directory.
  assert run.init_kwargs == {'name': 'my-run', 'config': None,
                             'dir': str(tmp_path / 'my-run')}
  steps = [step for step, _ in run.logged]
  assert steps == sorted(steps)  # W&B needs steps in order.
  assert _merged(run.logged) == _by_step(_records(tmp_path / 'my-run'))
  assert not run.finished
  loop.close_reporters()
  assert run.finished


def test_report_config_is_the_trackers_run_parameters(tmp_path, monkeypatch):
  wandb = _fake_wandb(monkeypatch)
  mlflow = _FakeMlflow().install(monkeypatch)
  settings = {'d_model': 16, 'learning_rate': 0.05, 'note': None}
  _loop(tmp_path / 'r', report_to='wandb,mlflow', report_config=settings)
  assert wandb.runs[0].init_kwargs['config'] == settings
  assert mlflow.params == {'d_model': '16', 'learning_rate': '0.05',
                           'note': 'None'}
  with pytest.raises(ArgumentError, match='report_config must be a mapping'):
    training.LoopOptions(report_config=['d_model'])


def test_wandb_dir_setting_wins_over_the_run_directory(tmp_path, monkeypatch):
  wandb = _fake_wandb(monkeypatch)
  reporters.WandbReporter(files_dir=str(tmp_path), dir='/elsewhere')
  monkeypatch.setenv('WANDB_DIR', '/from-env')
  reporters.WandbReporter(files_dir=str(tmp_path))
  assert [r.init_kwargs.get('dir') for r in wandb.runs] == ['/elsewhere', None]


def test_wandb_that_cannot_start_is_one_line(tmp_path, monkeypatch):
  _fake_wandb(monkeypatch, fails=_FakeWandbError(
      'No API key configured.\nUse `wandb login` to log in.'))
  with pytest.raises(UserInputError) as e:
    _loop(tmp_path / 'run', report_to='wandb')
  message = str(e.value)
  assert message.startswith("report_to='wandb': W&B could not start a run: "
                            'No API key configured. Use `wandb login`')
  assert 'WANDB_MODE=offline' in message and '\n' not in message


class _FakeMlflowError(Exception):
  """`mlflow.exceptions.MlflowException`."""


class _FakeMlflow(types.ModuleType):
  """mlflow as far as the reporter uses it: the active run, the fluent API's
  start and end of a run, and clients that log batches into this object.

  `uri`: the tracking URI the user set (None: none); `fails`: raised by
  `create_run`.
  """

  def __init__(self, active=None, uri=None, fails=None):
    super().__init__('mlflow')
    self.active, self.uri, self.fails = active, uri, fails
    self.started, self.ended, self.terminated = [], 0, []
    self.runs = {}  # run id -> (tracking URI, experiment id, run name)
    self.metrics, self.params = [], {}  # (run id, step, {key: value}), ...
    self.experiments = {'Default': '0'}
    self.tracking = types.SimpleNamespace(
        MlflowClient=self._client, is_tracking_uri_set=lambda: bool(self.uri))

  def _new_run(self, uri, experiment_id, run_name):
    run_id = f'run-{len(self.runs)}'
    self.runs[run_id] = (uri, experiment_id, run_name)
    return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id))

  def _client(self, tracking_uri=None):
    fake, uri = self, tracking_uri or self.uri

    class Client:

      def get_experiment_by_name(self, name):
        found = fake.experiments.get(name)
        return found and types.SimpleNamespace(experiment_id=found)

      def create_experiment(self, name):
        fake.experiments[name] = str(len(fake.experiments))
        return fake.experiments[name]

      def create_run(self, experiment_id, run_name=None):
        if fake.fails is not None:
          raise fake.fails
        return fake._new_run(uri, experiment_id, run_name)

      def log_batch(self, run_id, metrics=(), params=()):
        assert fake.runs[run_id][0] == uri
        fake.params.update({p.key: p.value for p in params})
        for m in metrics:
          assert isinstance(m.timestamp, int)
          fake.metrics.append((run_id, m.step, {m.key: m.value}))

      def set_terminated(self, run_id):
        fake.terminated.append(run_id)
    return Client()

  def active_run(self):
    return self.active

  def start_run(self, run_name=None):
    self.active = self._new_run(self.uri, 'fluent', run_name)
    self.started.append(run_name)
    return self.active

  def end_run(self):
    self.active = None
    self.ended += 1

  def install(self, monkeypatch):
    """Puts this mlflow into sys.modules (with no file-store opt-in set)."""
    entities = types.ModuleType('mlflow.entities')
    entities.Metric = collections.namedtuple(
        'Metric', 'key value timestamp step')
    entities.Param = collections.namedtuple('Param', 'key value')
    entities.Experiment = types.SimpleNamespace(
        DEFAULT_EXPERIMENT_NAME='Default')
    exceptions = types.ModuleType('mlflow.exceptions')
    exceptions.MlflowException = _FakeMlflowError
    monkeypatch.setitem(sys.modules, 'mlflow', self)
    monkeypatch.setitem(sys.modules, 'mlflow.entities', entities)
    monkeypatch.setitem(sys.modules, 'mlflow.exceptions', exceptions)
    monkeypatch.delenv('MLFLOW_ALLOW_FILE_STORE', raising=False)
    monkeypatch.delenv('MLFLOW_EXPERIMENT_NAME', raising=False)
    return self

  def logged(self, run_id):
    return _merged([(step, m) for r, step, m in self.metrics if r == run_id])


def test_report_to_mlflow_without_a_store_logs_into_the_run_dir(
    tmp_path, monkeypatch):
  mlflow = _FakeMlflow().install(monkeypatch)
  loop = _loop(tmp_path / 'r1', log_every=5, report_to='mlflow')
  loop.run(10)
  (run_id,) = mlflow.runs
  store = (tmp_path / 'r1' / 'mlruns').as_uri()
  assert mlflow.runs[run_id] == (store, '0', 'r1')  # Default experiment.
  assert os.environ['MLFLOW_ALLOW_FILE_STORE'] == 'true'  # MLflow 3's opt-in.
  assert mlflow.logged(run_id) == _by_step(_records(tmp_path / 'r1'))
  assert mlflow.started == [] and mlflow.active is None  # Not the fluent run.
  loop.close_reporters()
  assert mlflow.terminated == [run_id] and mlflow.ended == 0
  monkeypatch.setenv('MLFLOW_EXPERIMENT_NAME', 'mine')
  monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'false')  # The user's wins.
  reporters.MlflowReporter(run_name='r2', store_dir='/s').close()
  assert mlflow.runs['run-1'] == ('file:///s', mlflow.experiments['mine'], 'r2')
  assert os.environ['MLFLOW_ALLOW_FILE_STORE'] == 'false'


def test_report_to_mlflow_with_a_store_set_starts_a_run_there(
    tmp_path, monkeypatch):
  mlflow = _FakeMlflow(uri='http://tracking:5000').install(monkeypatch)
  loop = _loop(tmp_path / 'r1', log_every=5, report_to='mlflow')
  loop.run(10)
  assert mlflow.started == ['r1']
  run_id = mlflow.active.info.run_id
  assert mlflow.runs[run_id][0] == 'http://tracking:5000'
  assert mlflow.logged(run_id) == _by_step(_records(tmp_path / 'r1'))
  loop.close_reporters()
  assert mlflow.ended == 1 and mlflow.active is None
  assert mlflow.terminated == []


def test_mlflow_reporter_joins_an_active_run_and_leaves_it_open(monkeypatch):
  mlflow = _FakeMlflow(uri='http://tracking:5000').install(monkeypatch)
  users_run = mlflow.start_run('mine')
  reporter = reporters.MlflowReporter(run_name='x', config={'d_model': 64},
                                      store_dir='/unused')
  assert reporter.run_id == users_run.info.run_id and len(mlflow.runs) == 1
  assert mlflow.params == {'d_model': '64'}
  reporter.record(3, 'train', LOSS, np.float32(2.5))
  reporter.record(1, 'eval', 'metrics/A', 0.5)
  reporter.record(1, 'train', 'metrics/nan', float('nan'))  # Not sent.
  reporter.close()
  assert [(step, m) for _, step, m in mlflow.metrics] == [
      (1, {'eval/metrics/A': 0.5}), (3, {f'train/{LOSS}': 2.5})]
  assert mlflow.ended == 0 and mlflow.active is users_run


def test_mlflow_that_cannot_start_is_one_line(tmp_path, monkeypatch):
  _FakeMlflow(fails=_FakeMlflowError(
      'The filesystem tracking backend\nis in maintenance mode.')).install(
          monkeypatch)
  with pytest.raises(UserInputError) as e:
    _loop(tmp_path / 'run', report_to='mlflow')
  assert str(e.value) == ("report_to='mlflow': MLflow could not start a run: "
                          'The filesystem tracking backend is in maintenance '
                          'mode.')


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


def _mlflow_history(store):
  """`({step: {key: value}}, run)` of the one run in MLflow store `store`."""
  import mlflow
  client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
  (run,) = client.search_runs(experiment_ids=['0'])
  history = {}
  for key in run.data.metrics:
    for m in client.get_metric_history(run.info.run_id, key):
      history.setdefault(m.step, {})[key] = m.value
  return history, run


def _assert_same(history, expected):
  assert history.keys() == expected.keys()
  for step, values in expected.items():
    assert history[step] == pytest.approx(values, rel=1e-12), step


@pytest.mark.skipif(not _installed('mlflow'), reason='mlflow not installed')
def test_real_mlflow_store_in_the_run_dir_holds_the_jsonl_values(
    tmp_path, monkeypatch):
  """The extra as shipped (mlflow-skinny, nothing configured): MLflow 3's
  default SQLite store needs the full package, so the run's own store."""
  import mlflow
  for name in ('MLFLOW_TRACKING_URI', 'MLFLOW_ALLOW_FILE_STORE',
               'MLFLOW_EXPERIMENT_NAME', 'MLFLOW_EXPERIMENT_ID'):
    monkeypatch.delenv(name, raising=False)
  assert not mlflow.tracking.is_tracking_uri_set()
  monkeypatch.chdir(tmp_path)  # Where MLflow's own default would write.
  loop = _loop(tmp_path / 'run', log_every=5, report_to='mlflow')
  loop.run(10)
  loop.close_reporters()
  history, run = _mlflow_history(tmp_path / 'run' / 'mlruns')
  assert run.info.run_name == 'run' and run.info.status == 'FINISHED'
  _assert_same(history, _by_step(_records(tmp_path / 'run')))
  assert sorted(os.listdir(tmp_path)) == ['run']


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


def _wandb_offline_history(wandb_dir):
  """`_wandb_history` of the one offline run in `wandb_dir`, once ended."""
  (log,) = wandb_dir.glob('offline-run-*/run-*.wandb')
  deadline = time.time() + 60  # W&B's service writes the file after finish().
  history, ended = _wandb_history(log)
  while not ended and time.time() < deadline:
    time.sleep(0.5)
    history, ended = _wandb_history(log)
  assert ended
  return history


@pytest.mark.skipif(not _installed('wandb'), reason='wandb not installed')
def test_real_wandb_offline_run_records_the_jsonl_values(tmp_path, monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  loop = _loop(tmp_path / 'run', log_every=5, report_to='wandb')
  loop.run(10)
  loop.close_reporters()
  _assert_same(_wandb_offline_history(tmp_path / 'wandb'),
               _by_step(_records(tmp_path / 'run')))


# --- retrax train --log_every / --report_to -------------------------------------

_TINY_RUN = ['--steps', '6', '--quiet', '--no-sample', '--log_every', '2',
             '--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
             '--set', 'd_head=8', '--set', 'batch_size=2', '--set',
             'eval_every=3', '--set', 'warmup_steps=0', '--attention', 'local',
             '--length', '16', '--trax_files', 'false']
_CLI_LOSS = 'train/metrics/WeightedCategoryCrossEntropy'


def _train(out, *flags):
  return cli.main(['train', '--output_dir', str(out), *_TINY_RUN, *flags])


def test_cli_report_to_gets_what_metrics_jsonl_holds(tmp_path, monkeypatch):
  mlflow = _FakeMlflow().install(monkeypatch)
  wandb = _fake_wandb(monkeypatch)
  out = tmp_path / 'run'
  assert _train(out, '--report_to', 'wandb,mlflow') == 0
  settings = json.loads((out / 'run_config.json').read_text())
  assert (settings['log_every'], settings['report_to']) == (2, 'wandb,mlflow')
  expected = _by_step(_records(out))
  # Evals at 1, 3, 6 log the training loss; log_every=2 adds 2 and 4.
  assert [s for s in expected if _CLI_LOSS in expected[s]] == [1, 2, 3, 4, 6]
  (run,) = wandb.runs
  assert _merged(run.logged) == expected and run.finished  # Ended by the job.
  (run_id,) = mlflow.runs
  assert mlflow.runs[run_id][0] == (out / 'mlruns').as_uri()
  assert mlflow.logged(run_id) == expected and mlflow.terminated == [run_id]
  # The run's settings are the trackers' parameters, as run_config.json has
  # them (MLflow keeps parameters as text).
  assert run.init_kwargs['config'] == settings
  assert settings['d_model'] == 16
  assert mlflow.params == {k: str(v) for k, v in settings.items()}


@pytest.mark.parametrize('flags,message', [
    (['--report_to', 'tensorboard'], "unknown reporter 'tensorboard'"),
    (['--log_every', '-1'], 'log_every must be >= 0'),
])
def test_cli_bad_report_settings_are_one_line(flags, message, tmp_path, capsys):
  assert _train(tmp_path / 'run', *flags) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and '\n' not in err
  assert not (tmp_path / 'run').exists()


def _read_mlflow(out):
  return _mlflow_history(out / 'mlruns')[0]


def _read_wandb(out):
  return _wandb_offline_history(out / 'wandb')


@pytest.mark.parametrize('name,read', [
    pytest.param('mlflow', _read_mlflow, marks=pytest.mark.skipif(
        not _installed('mlflow'), reason='mlflow not installed')),
    pytest.param('wandb', _read_wandb, marks=pytest.mark.skipif(
        not _installed('wandb'), reason='wandb not installed')),
])
def test_real_tracker_of_cli_run_holds_the_jsonl_values(
    name, read, tmp_path, monkeypatch):
  """`retrax train --report_to NAME` with the extra as shipped, offline and
  otherwise unconfigured: the tracker's files are in the run directory."""
  for var in ('MLFLOW_TRACKING_URI', 'MLFLOW_ALLOW_FILE_STORE',
              'MLFLOW_EXPERIMENT_NAME', 'WANDB_DIR'):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_SILENT', 'true')
  monkeypatch.chdir(tmp_path)
  assert _train(tmp_path / 'run', '--report_to', name) == 0
  expected = _by_step(_records(tmp_path / 'run'))
  assert _CLI_LOSS in expected[2]
  _assert_same(read(tmp_path / 'run'), expected)
  assert sorted(os.listdir(tmp_path)) == ['run']
