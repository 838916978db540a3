"""When a `Loop` evaluates, checkpoints and logs: `step -> bool` schedules."""

import numbers
from typing import Callable

from retrax.errors import UserInputError

# `step -> whether to act at that step` (`Loop(checkpoint_at=...)`, ...).
StepSchedule = Callable[[int], bool]


def never(step: int) -> bool:
  """A step schedule that is never true (e.g. `Loop(eval_at=never)`)."""
  del step
  return False


def at_step_1_and_every_nth_step(period):
  """True at step 1 and at every multiple of `period` (never if None)."""
  if period is None:
    return never
  return lambda step: step == 1 or (step > 0 and step % period == 0)


def defaults(task, checkpoint_at, permanent_checkpoint_at, eval_at):
  """`(checkpoint_at, permanent_checkpoint_at, eval_at)`, defaults from `task`."""
  default_at = at_step_1_and_every_nth_step(task.n_steps_per_checkpoint)
  return (checkpoint_at or default_at,
          permanent_checkpoint_at or at_step_1_and_every_nth_step(
              task.n_steps_per_permanent_checkpoint),
          eval_at or default_at)


def log_at(log_every):
  """The schedule of `Loop(log_every=...)`: step 1 and every `log_every`
  steps, or never (None: training metrics are logged at evals only)."""
  if log_every is None:
    return never
  if (not isinstance(log_every, numbers.Integral) or
      isinstance(log_every, bool) or log_every < 1):
    raise UserInputError(
        f'Loop: log_every must be an int >= 1 (steps between training-metric '
        f'logs) or None; got {log_every!r}.')
  return at_step_1_and_every_nth_step(int(log_every))
