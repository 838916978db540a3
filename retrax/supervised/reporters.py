"""Training metrics sent to Weights & Biases or MLflow (`Loop(report_to=...)`).

A reporter gets every scalar the loop writes to `metrics.jsonl` (training
loss and statistics at `log_every` and eval steps, eval metrics), named
`<mode>/<metric>` (`train/metrics/CrossEntropyLoss`,
`eval/metrics/Accuracy`, `train/training/learning_rate`) at its step:

    loop = training.Loop(model, task, eval_tasks=[eval_task],
                         output_dir='~/run', log_every=10, report_to='wandb')

Both libraries are optional extras (`pip install "retrax[wandb]"`,
`"retrax[mlflow]"`), imported only when asked for. Their own settings
apply: `WANDB_PROJECT`, `WANDB_MODE=offline`, `MLFLOW_TRACKING_URI`,
`MLFLOW_EXPERIMENT_NAME` ... The W&B or MLflow run starts when the `Loop`
is built, stays open across `run` calls (a notebook's cells report to one
run) and ends with `Loop.close_reporters()` or at exit.

Any object with `record(step, mode, name, value)`, `flush()` and `close()`
can be passed in `report_to` too.
"""

import importlib
import math

from retrax.errors import missing_package
from retrax.errors import UserInputError

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
    **init_kwargs: more arguments for `wandb.init` (project, entity, ...).
  """

  def __init__(self, run_name=None, config=None, **init_kwargs):
    super().__init__()
    wandb = _import('wandb', 'wandb')
    self._run = wandb.init(name=run_name, config=config, **init_kwargs)

  def _send(self, step, metrics):
    self._run.log(metrics, step=step)

  def close(self):
    self.flush()
    if self._run is not None:
      self._run.finish()
      self._run = None


class MlflowReporter(_Buffered):
  """Reports to an MLflow run (a new one, or the active one if there is).

  Args:
    run_name: the new run's name (the `Loop` passes its output_dir's name).
    config: a dict of settings logged as the run's parameters.
  """

  def __init__(self, run_name=None, config=None):
    super().__init__()
    self._mlflow = _import('mlflow', 'mlflow')
    self._owned = self._mlflow.active_run() is None
    run = (self._mlflow.start_run(run_name=run_name) if self._owned
           else self._mlflow.active_run())
    self._run_id = run.info.run_id
    if config:
      self._mlflow.log_params(config)

  @property
  def run_id(self):
    return self._run_id

  def _send(self, step, metrics):
    self._mlflow.log_metrics(metrics, step=step)

  def close(self):
    self.flush()
    if self._owned and self._run_id is not None:
      self._mlflow.end_run()
    self._run_id = None


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


def make(report_to, run_name=None, config=None):
  """The reporters of `report_to` (see `parse`), built: each named library
  is imported now, so a missing one fails before any training.

  Raises:
    UserInputError: an unknown name.
    MissingPackageError: wandb / mlflow is not installed (the message says
      what to pip install).
  """
  return [_CLASSES[item](run_name=run_name, config=config)
          if isinstance(item, str) else item for item in parse(report_to)]
