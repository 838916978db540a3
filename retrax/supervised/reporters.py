"""Training metrics sent to Weights & Biases or MLflow (`LoopOptions.report_to`).

A reporter gets every scalar the loop writes to `metrics.jsonl` (training
loss and statistics at `log_every` and eval steps, eval metrics), named
`<mode>/<metric>` (`train/metrics/CrossEntropyLoss`,
`eval/metrics/Accuracy`, `train/training/learning_rate`) at its step:

    loop = training.Loop(model, task, eval_tasks=[eval_task],
                         output_dir='~/run', options=training.LoopOptions(
                             log_every=10, report_to='wandb'))

Both libraries are optional extras (`pip install "retrax[wandb]"`,
`"retrax[mlflow]"`), imported only when asked for. Their own settings
apply (`WANDB_PROJECT`, `WANDB_MODE=offline`, `MLFLOW_TRACKING_URI`,
`MLFLOW_EXPERIMENT_NAME` ...); what they would otherwise write into the
working directory goes into the run directory (`wandb/`, `mlruns/`; see
each reporter). The W&B or MLflow run starts when the `Loop` is built, stays
open across `run` calls (a notebook's cells report to one run) and ends with
`Loop.close_reporters()` or at exit. A run that cannot start (no W&B login,
an unreachable MLflow server) fails there with one line.

Any object with `record(step, mode, name, value)`, `flush()` and `close()`
can be passed in `report_to` too.
"""

import atexit
import functools
import importlib
import math
import os
import pathlib
import time

from retrax.errors import missing_package
from retrax.errors import one_line
from retrax.errors import UserInputError
from retrax.run_layout import MLFLOW_STORE

NAMES = ('wandb', 'mlflow')


def _import(package, name):
  try:
    return importlib.import_module(package)
  except ImportError:
    raise missing_package(package, f"report_to='{name}'", name) from None


class _Buffered:
  """Holds records until `flush`, then sends them one step at a time."""

  def __init__(self):
    self._pending = {}  # step -> {'<mode>/<metric>': value}

  def record(self, step, mode, name, value):
    value = float(value)
    if math.isfinite(value):
      self._pending.setdefault(int(step), {})[f'{mode}/{name}'] = value

  def flush(self):
    pending, self._pending = self._pending, {}
    for step in sorted(pending):
      self._send(step, pending[step])

  def _send(self, step, metrics):
    raise NotImplementedError


class WandbReporter(_Buffered):
  """Reports to a W&B run (`wandb.init`; `WANDB_MODE=offline` works offline).

  Args:
    run_name: the W&B run's name (the `Loop` passes its output_dir's name).
    config: a dict of settings recorded with the run (the CLI's config).
    files_dir: where W&B keeps its files (`<files_dir>/wandb/`) unless
      `WANDB_DIR` or a `dir` argument says (the `Loop` passes its
      output_dir); None: W&B's default, the working directory.
    **init_kwargs: more arguments for `wandb.init` (project, entity, ...).
  """

  def __init__(self, run_name=None, config=None, files_dir=None,
               **init_kwargs):
    super().__init__()
    wandb = _import('wandb', 'wandb')
    wandb_error = importlib.import_module('wandb.errors').Error
    if files_dir is not None and not os.environ.get('WANDB_DIR'):
      init_kwargs.setdefault('dir', os.fspath(files_dir))
    try:
      self._run = wandb.init(name=run_name, config=config, **init_kwargs)
    except wandb_error as e:
      raise UserInputError(
          f"report_to='wandb': W&B could not start a run: {one_line(e)} "
          '(WANDB_MODE=offline logs to files without an account)') from None

  def _send(self, step, metrics):
    self._run.log(metrics, step=step)

  def close(self):
    self.flush()
    if self._run is not None:
      self._run.finish()
      self._run = None


class MlflowReporter(_Buffered):
  """Reports to an MLflow run: the active one if there is (the caller's
  `mlflow.start_run`: joined, and left open), else a new one.

  A new run goes where MLflow is set to log (`MLFLOW_TRACKING_URI`,
  `mlflow.set_tracking_uri`; its experiment settings apply). Where it is set
  to nothing, it goes into a file store at `store_dir` (`mlflow ui
  --backend-store-uri <store_dir>` shows it), in the experiment
  `MLFLOW_EXPERIMENT_NAME` or else MLflow's Default: MLflow 3's own default,
  a SQLite file in the working directory, needs the full `mlflow` package,
  while the extra installs `mlflow-skinny`. Choosing that store sets
  `MLFLOW_ALLOW_FILE_STORE=true` (MLflow 3's opt-in to file stores) unless
  it is set.

  Args:
    run_name: the new run's name (the `Loop` passes its output_dir's name).
    config: a dict of settings logged as the run's parameters.
    store_dir: see above (the `Loop` passes `<output_dir>/mlruns`); None:
      MLflow's own default.
  """

  def __init__(self, run_name=None, config=None, store_dir=None):
    super().__init__()
    mlflow = _import('mlflow', 'mlflow')
    self._entities = importlib.import_module('mlflow.entities')
    mlflow_error = importlib.import_module('mlflow.exceptions').MlflowException
    self._end = None  # Ends the run, if this reporter started it.
    try:
      self._client, self._run_id = self._open(mlflow, run_name, store_dir)
      if config:
        self._client.log_batch(self._run_id, params=[
            self._entities.Param(k, str(v)) for k, v in config.items()])
    except mlflow_error as e:
      raise UserInputError(f"report_to='mlflow': MLflow could not start a "
                           f'run: {one_line(e, 600)}') from None
    # MLflow ends a run of its client API at exit only if told to.
    atexit.register(self.close)

  def _open(self, mlflow, run_name, store_dir):
    """(client, run id) of the run to log to; sets `_end` for a new one."""
    active = mlflow.active_run()
    if active is not None:
      return mlflow.tracking.MlflowClient(), active.info.run_id
    if mlflow.tracking.is_tracking_uri_set() or store_dir is None:
      run = mlflow.start_run(run_name=run_name)
      self._end = mlflow.end_run
      return mlflow.tracking.MlflowClient(), run.info.run_id
    os.environ.setdefault('MLFLOW_ALLOW_FILE_STORE', 'true')
    client = mlflow.tracking.MlflowClient(tracking_uri=pathlib.Path(
        os.path.abspath(store_dir)).as_uri())
    name = (os.environ.get('MLFLOW_EXPERIMENT_NAME') or
            self._entities.Experiment.DEFAULT_EXPERIMENT_NAME)
    experiment = client.get_experiment_by_name(name)
    experiment_id = (experiment.experiment_id if experiment else
                     client.create_experiment(name))
    run = client.create_run(experiment_id, run_name=run_name)
    self._end = functools.partial(client.set_terminated, run.info.run_id)
    return client, run.info.run_id

  @property
  def run_id(self):
    return self._run_id

  def _send(self, step, metrics):
    now = int(time.time() * 1000)
    self._client.log_batch(self._run_id, metrics=[
        self._entities.Metric(k, v, now, step) for k, v in metrics.items()])

  def close(self):
    if self._run_id is None:
      return
    self.flush()
    if self._end is not None:
      self._end()
    self._run_id = self._end = None
    atexit.unregister(self.close)


_CLASSES = {'wandb': WandbReporter, 'mlflow': MlflowReporter}


def parse(report_to):
  """The reporter names in `report_to`: None, '', 'wandb', 'wandb,mlflow' or
  a list of names and reporter objects (objects are kept as they are)."""
  if report_to is None:
    return []
  if isinstance(report_to, str):
    report_to = [n.strip() for n in report_to.split(',') if n.strip()]
  items = list(report_to) if isinstance(report_to, (list, tuple)) else [
      report_to]
  for item in items:
    if isinstance(item, str) and item not in NAMES:
      raise UserInputError(f'report_to: unknown reporter {item!r}; use '
                           f"{' or '.join(map(repr, NAMES))} (or a list).")
  return items


def make(report_to, output_dir=None, config=None):
  """The reporters of `report_to` (see `parse`), built: each named library
  is imported now, so a missing one fails before any training. A run
  directory `output_dir` names their runs and holds the files W&B and
  MLflow would otherwise write into the working directory (see each); each
  records the mapping `config` (the run's settings) as its parameters.

  Raises:
    UserInputError: an unknown name.
    MissingPackageError: wandb / mlflow is not installed (the message says
      what to pip install).
  """
  items = parse(report_to)
  config = None if config is None else dict(config)  # A copy of its own.
  run_name = None
  where: dict[str, dict[str, str]] = {'wandb': {}, 'mlflow': {}}
  if output_dir is not None:
    output_dir = os.fspath(output_dir)
    run_name = os.path.basename(os.path.normpath(output_dir))
    where = {'wandb': {'files_dir': output_dir},
             'mlflow': {'store_dir': os.path.join(output_dir, MLFLOW_STORE)}}
  return [_CLASSES[item](run_name=run_name, config=config, **where[item])
          if isinstance(item, str) else item for item in items]
