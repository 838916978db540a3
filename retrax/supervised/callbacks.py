"""Loop callbacks: code run before and after chosen training steps.

A callback class is passed to `Loop(..., callbacks=[MyCallback])`; the loop
instantiates it with itself and, at every step `n` for which `call_at(n)` is
true, calls `on_step_begin(n)` before the step and `on_step_end(n)` after it.
Inside these hooks `loop.model.weights` and `loop.model.state` are current.

    class PrintWeightsNorm(TrainingStepCallback):
      def call_at(self, step):
        return step % 100 == 0
      def on_step_begin(self, step):
        pass
      def on_step_end(self, step):
        print(step, optimizers.l2_norm(self._loop.model.weights))
"""

import abc


class TrainingStepCallback(abc.ABC):
  """Base class of callbacks triggered before and after a training step."""

  def __init__(self, loop):
    """Keeps the `Loop` instance the callback belongs to."""
    self._loop = loop

  @abc.abstractmethod
  def call_at(self, step):
    """Returns whether to call the hooks at `step`."""

  @abc.abstractmethod
  def on_step_begin(self, step):
    """Called before training step `step` when `call_at(step)` is true."""

  @abc.abstractmethod
  def on_step_end(self, step):
    """Called after training step `step` when `call_at(step)` is true."""
