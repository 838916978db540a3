"""`LoopOptions`: retrax's own options of a `Loop`, beside Trax's arguments.

    loop = training.Loop(model, tasks, output_dir='~/run',
                         options=training.LoopOptions(log_every=100,
                                                      report_to='wandb'))

Trax's `Loop` takes 17 arguments; Trax programs pass those and never these,
so they sit in one frozen object, checked when it is made: a bad value is
one line naming the option, before any model is built.
"""

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import jax

from retrax.supervised import reporters
from retrax.validation import ArgumentTypeError
from retrax.validation import check_choice
from retrax.validation import check_int

_OWNER = 'LoopOptions'
CHECKPOINT_KINDS = ('Loop', 'Trainer')


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """retrax's options of `Loop` (all optional; the defaults are Trax's behaviour
  plus retrax's safety checks).

  Attributes:
    keep_checkpoints: rolling checkpoints (`ckpt_<step>`) kept; older ones
      are deleted so that a long run does not fill the disk (permanent ones
      are never deleted).
    progress_bar: True/False, or None: a bar in notebooks and (for long runs)
      terminals, a line every 30 s elsewhere (see `progress`).
    check_batches: check each batch on the host (shapes, dtypes, id ranges),
      so a bad batch is one clear error instead of a wrong result.
    write_trax_files: also write Trax's checkpoint files (`model.pkl.gz` ...)
      at each checkpoint, so Trax itself can read the run.
    opt_step_offset: added to the step count the optimizer and `lr_schedule`
      see (the legacy `Trainer` passes -1: Trax's Trainer counts the steps
      done before the update).
    checkpoint_kind: 'Loop' or 'Trainer', recorded in checkpoints so that a
      run resumes under the API that wrote it.
    log_every: also log the training metrics (mean loss, learning rate,
      steps/s, optimizer stats) at step 1 and every `log_every` steps to
      metrics.jsonl, TensorBoard and the reporters (not stdout); None: at
      eval steps only, as Trax.
    report_to: 'wandb', 'mlflow', 'wandb,mlflow', or a list of names and
      reporter objects: also send every logged metric there (see
      `reporters`).
    report_config: settings the reporters record as the run's parameters
      (W&B's run config, MLflow's params); `retrax train` passes its run
      config. None: none.
    mesh: 'data=2,fsdp=4', a dict of axis sizes or a jax Mesh: split the
      weights and slots over the `fsdp` axis (see `sharding`); None: data
      parallel over `n_devices`.
  """
  keep_checkpoints: int = 3
  progress_bar: Optional[bool] = None
  check_batches: bool = True
  write_trax_files: bool = True
  opt_step_offset: int = 0
  checkpoint_kind: str = 'Loop'
  log_every: Optional[int] = None
  report_to: Union[str, Sequence[Any], None] = None
  report_config: Optional[Mapping[str, Any]] = None
  mesh: Union[str, Mapping[str, int], jax.sharding.Mesh, None] = None

  def __post_init__(self):
    check_int(_OWNER, 'keep_checkpoints', self.keep_checkpoints, minimum=1)
    _check_bool('progress_bar', self.progress_bar, allow_none=True)
    _check_bool('check_batches', self.check_batches)
    _check_bool('write_trax_files', self.write_trax_files)
    check_int(_OWNER, 'opt_step_offset', self.opt_step_offset)
    check_choice(_OWNER, 'checkpoint_kind', self.checkpoint_kind,
                 CHECKPOINT_KINDS)
    check_int(_OWNER, 'log_every', self.log_every, minimum=1, allow_none=True)
    reporters.parse(self.report_to)  # Unknown names fail before any work.
    if self.report_config is not None and not (
        isinstance(self.report_config, Mapping) and
        all(isinstance(k, str) for k in self.report_config)):
      raise ArgumentTypeError(
          f'{_OWNER}: report_config must be a mapping of str keys (the '
          f'settings to record) or None; got {self.report_config!r:.80}.')
    # `mesh` is checked against the devices when the Loop places the state.


def _check_bool(name, value, allow_none=False):
  if not (isinstance(value, bool) or (allow_none and value is None)):
    expected = 'True, False or None' if allow_none else 'True or False'
    raise ArgumentTypeError(f'{_OWNER}: {name} must be {expected}; got '
                            f'{value!r} ({type(value).__name__}).')
