"""When a `Loop` evaluates, checkpoints and logs: `step -> bool` schedules."""

from typing import Callable

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
