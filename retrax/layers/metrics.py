"""Losses and metrics as layers, with Trax's names, formulas and layer trees.

A metric layer maps `(model_output, targets[, weights])` to a scalar:

  - model_output: a batch of predictions, e.g. [batch, ..., n_categories]
    activation vectors (logits or log-probabilities, as each layer says);
  - targets: a batch of integer categories [batch, ...] or float targets;
  - weights: floats broadcastable to the targets, weighting batch items or
    positions (0 masks padding).

The weighted layers return `sum(value * weights) / sum(weights)`. Trax divided
by the weight sum per device inside `pmap`; under retrax's jit with a sharded
batch, the sums already run over the global batch.

Integer targets must be categories of the model outputs, in `[0,
n_categories)`; called eagerly, the category layers (cross-entropies and
accuracies) raise a ValueError for any other target with a nonzero weight.
Under `jax.jit` they cannot see the values: such a target has an all-zero
one-hot row, so it adds 0 cross-entropy and is never counted correct (Trax's
behaviour); the training `Loop` checks each batch's targets on the host.

Several layers are `Serial` compositions, as in Trax (e.g. `CrossEntropyLoss`
is `Serial(_CrossEntropy, _WeightedMean)`, printed `CrossEntropyLoss_in3`),
so their weight trees and reprs match Trax's.
"""

import jax
import numpy as np

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import tutorial_checks
from retrax.validation import ArgumentValueError


def _check_same_shape(name, what1, x1, what2, x2):
  if tuple(x1.shape) != tuple(x2.shape):
    raise InputValueError(f'{name}: {what1} of shape {tuple(x1.shape)} and {what2} '
                          f'of shape {tuple(x2.shape)} must have the same shape.')


def _check_categories(name, model_output, targets, predictions_shape=None):
  """Targets must have the shape of the predictions (model_output[..., 0])."""
  expected = tuple(model_output.shape[:-1]) if predictions_shape is None else (
      predictions_shape)
  if tuple(targets.shape) != expected:
    raise InputValueError(
        f'{name}: targets should have shape {expected} (model outputs of shape '
        f'{tuple(model_output.shape)} without the last, category axis); got '
        f'targets of shape {tuple(targets.shape)}.')


def _check_target_range(name, targets, n_classes, weights=None):
  """Eager calls: each target with a nonzero weight must be in [0, n_classes).

  Under `jax.jit` the values are traced and cannot be checked: an
  out-of-range target then has an all-zero one-hot row (0 cross-entropy for
  that item) and is never counted correct, as in Trax. The training `Loop`
  checks every batch's targets on the host before its jitted step.
  """
  if any(isinstance(x, jax.core.Tracer) for x in (targets, weights)):
    return
  t = np.asarray(targets)
  if t.dtype.kind not in 'iu':
    return
  bad = (t < 0) | (t >= n_classes)
  if weights is not None and bad.any():
    try:
      bad &= np.broadcast_to(np.asarray(weights) != 0, t.shape)
    except ValueError:
      pass  # Weights not of the targets' shape: check every target.
  if bad.any():
    raise InputValueError(
        f'{name}: target {t[bad][0]} is not a category of the model outputs '
        f'({n_classes} categories, 0 to {n_classes - 1}); {int(bad.sum())} '
        f'of {t.size} targets are out of range.')


def _weight_sum(weights):
  """The sum of the weights (global under sharded jit)."""
  return jnp.sum(weights)


def _weighted_sum(values, weights):
  """sum(values * weights), with the promotion and broadcasting explicit."""
  values, weights = fastmath.promoted(values, weights)
  return jnp.sum(values * weights)


def _weighted_mean(values, weights):
  """sum(values * weights) / sum(weights) (the sum of the weights as given)."""
  total = _weighted_sum(values, weights)
  return total / _weight_sum(jnp.asarray(weights).astype(total.dtype))


def _div_or_zero(num, den):
  """num / den, and 0 where den is 0 (Trax computes 0/0 = NaN, then sets 0)."""
  return jnp.where(den == 0, 0., num / jnp.where(den == 0, 1, den))


# --- category metrics (model outputs are activation vectors) -----------------


def CategoryAccuracy():
  """Fraction of items whose argmax category equals the target.

  Inputs: model outputs [..., n_categories], targets [...] int.
  """
  def f(model_output, targets):
    predictions = jnp.argmax(model_output, axis=-1)
    _check_same_shape('CategoryAccuracy', 'predictions', predictions,
                      'targets', targets)
    _check_target_range('CategoryAccuracy', targets, model_output.shape[-1])
    n_correct = jnp.sum(jnp.equal(predictions, targets))
    return n_correct / predictions.size
  return base.Fn('CategoryAccuracy', f)


@configurable('trax.layers')
def WeightedCategoryAccuracy():
  """Weighted fraction of items whose argmax category equals the target.

  Inputs: model outputs [..., n_categories], targets [...] int, weights
  broadcastable to the targets.
  """
  def f(model_output, targets, weights):
    predictions = jnp.argmax(model_output, axis=-1)
    _check_same_shape('WeightedCategoryAccuracy', 'predictions', predictions,
                      'targets', targets)
    _check_target_range('WeightedCategoryAccuracy', targets,
                        model_output.shape[-1], weights)
    return _weighted_mean(jnp.equal(predictions, targets), weights)
  return base.Fn('WeightedCategoryAccuracy', f)


def _category_cross_entropy(model_output, targets, label_smoothing, cutoff):
  """Per-item cross-entropy of softmax(model_output) against (smoothed) one-hot targets."""
  n_categories = model_output.shape[-1]
  target_distributions = core.one_hot(targets, n_categories)
  if label_smoothing:
    if label_smoothing < 0. or label_smoothing > 1.:
      raise ArgumentValueError(
          f'Arg label_smoothing ({label_smoothing}) must be between 0 and 1.')
    target_distributions *= (1. - label_smoothing)
    target_distributions += label_smoothing / n_categories
  # Trax's float32 targets times the log-probabilities: float32 for bfloat16
  # logits, float64 for float64 ones (gradient checks), said explicitly.
  target_distributions, model_log_distributions = fastmath.promoted(
      target_distributions, core.log_softmax(model_output))
  cross_ent = -jnp.sum(target_distributions * model_log_distributions, axis=-1)
  if cutoff > 0.0:
    return jnp.maximum(cross_ent, cutoff) - cutoff
  return cross_ent


@configurable('trax.layers')
def CategoryCrossEntropy(label_smoothing=None):
  """Mean cross-entropy of softmax(logits) against one-hot targets.

  Inputs: logits [..., n_categories] (softmax is fused in), targets [...]
  int. With `label_smoothing` ε, targets are (1-ε)·one_hot + ε/n_categories.
  """
  def f(model_output, targets):
    _check_categories('CategoryCrossEntropy', model_output, targets)
    _check_target_range('CategoryCrossEntropy', targets,
                        model_output.shape[-1])
    cross_entropies = _category_cross_entropy(
        model_output, targets, label_smoothing, 0.0)
    return jnp.average(cross_entropies)
  return base.Fn('CategoryCrossEntropy', f)


@configurable('trax.layers')
def WeightedCategoryCrossEntropy(label_smoothing=None, cutoff=0.0):
  """Weighted mean cross-entropy of softmax(logits) against one-hot targets.

  Inputs: logits [..., n_categories], targets [...] int, weights
  broadcastable to the targets. Per-item losses below `cutoff` count as 0
  (others are reduced by `cutoff`): `max(ce, cutoff) - cutoff`.
  """
  def f(model_output, targets, weights):
    _check_categories('WeightedCategoryCrossEntropy', model_output, targets)
    _check_target_range('WeightedCategoryCrossEntropy', targets,
                        model_output.shape[-1], weights)
    cross_entropies = _category_cross_entropy(
        model_output, targets, label_smoothing, cutoff)
    return _weighted_mean(cross_entropies, weights)
  return base.Fn('WeightedCategoryCrossEntropy', f)


def BinaryCrossEntropy():
  """Mean binary cross-entropy of sigmoid(logit) against 0/1 targets.

  Inputs: logits [...] float, targets [...] in {0, 1}.
  """
  def f(model_output, targets):
    probabilities, targets = fastmath.promoted(fastmath.expit(model_output),
                                               targets)
    binary_entropies = -(targets * jnp.log(probabilities) +
                         (1 - targets) * jnp.log(1 - probabilities))
    return jnp.average(binary_entropies)
  return base.Fn('BinaryCrossEntropy', f)


def MaskedSequenceAccuracy():
  """Fraction of sequences predicted right at every non-zero-weight position.

  Inputs: model outputs [batch, length, n_categories], targets [batch,
  length] int, weights [batch, length] (0 = padding, ignored).
  """
  def f(model_output, targets, weights):
    predictions = jnp.argmax(model_output, axis=-1)
    _check_same_shape('MaskedSequenceAccuracy', 'predictions', predictions,
                      'targets', targets)
    _check_target_range('MaskedSequenceAccuracy', targets,
                        model_output.shape[-1], weights)
    position_is_padding = jnp.equal(weights, 0)
    position_is_accurate = jnp.logical_or(jnp.equal(predictions, targets),
                                          position_is_padding)
    sequence_is_accurate = jnp.all(position_is_accurate, axis=-1)
    return jnp.average(sequence_is_accurate)
  return base.Fn('MaskedSequenceAccuracy', f)


# --- Trax's older Serial-built metrics -----------------------------------------


def _Accuracy():
  """1.0 where the predicted category equals the target, else 0.0."""
  def f(predicted_category, target_category):
    return jnp.equal(predicted_category, target_category).astype(jnp.float32)
  return base.Fn('_Accuracy', f)


def _CrossEntropy(check_name=None):
  """Per-item cross-entropy from log-probabilities: -log_probs[target].

  With `check_name`, warns once if the inputs are not log-probabilities
  (`tutorial_checks`), naming that loss layer.
  """
  def f(model_output, target_category):
    _check_categories('CrossEntropyLoss', model_output, target_category)
    _check_target_range(check_name or 'CrossEntropyLoss', target_category,
                        model_output.shape[-1])
    if check_name is not None:
      tutorial_checks.check_log_probs(check_name, model_output)
    log_probs, target_distribution = fastmath.promoted(
        model_output, core.one_hot(target_category, model_output.shape[-1]))
    return -1.0 * jnp.sum(log_probs * target_distribution, axis=-1)
  return base.Fn('_CrossEntropy', f)


def _BinaryCrossEntropy():
  """Trax's binary cross-entropy on probabilities [batch, 1] (a dot product over the batch)."""
  def f(model_output, target_category):
    _check_same_shape('BinaryCrossEntropyLoss', 'model outputs', model_output,
                      'targets', target_category)
    batch_size = model_output.shape[0]
    model_output, target_category = fastmath.promoted(model_output,
                                                      target_category)
    j = jnp.dot(jnp.transpose(target_category), jnp.log(model_output))
    j += jnp.dot(jnp.transpose(1 - target_category), jnp.log(1 - model_output))
    return -1.0 / batch_size * jnp.squeeze(j)
  return base.Fn('_BinaryCrossEntropy', f)


def _WeightedMean():
  """sum(values * weights) / sum(weights)."""
  return base.Fn('_WeightedMean', _weighted_mean)


def _WeightedSequenceMean():
  """Fraction of sequences with no wrong position of non-zero (0/1) weight."""
  def f(values, weights):
    values, weights = fastmath.promoted(values, weights)
    not_correct = (1.0 - values) * weights
    axis_to_sum = tuple(range(1, len(not_correct.shape)))
    not_correct_seq = jnp.sum(not_correct, axis=axis_to_sum)
    correct_seq = 1.0 - jnp.minimum(1.0, not_correct_seq)
    return jnp.mean(correct_seq)
  return base.Fn('_WeightedSequenceMean', f)


def Accuracy(classifier=core.ArgMax()):
  """Weighted mean accuracy of `classifier`'s predictions (Trax: deprecated).

  Inputs: model outputs, targets, weights. `Serial(classifier, _Accuracy,
  _WeightedMean)`, printed as `Accuracy_in3`. As in Trax, the default
  classifier is one shared `ArgMax()` instance.
  """
  return cb.Serial(classifier, _Accuracy(), _WeightedMean(),
                   name='Accuracy', sublayers_to_print=[])


@configurable('trax.layers')
def SequenceAccuracy(classifier=core.ArgMax()):
  """Fraction of sequences `classifier` gets right at every weighted position (Trax: deprecated).

  Inputs: model outputs, targets, 0/1 weights.
  """
  return cb.Serial(classifier, _Accuracy(), _WeightedSequenceMean(),
                   name='SequenceAccuracy', sublayers_to_print=[])


def CrossEntropyLoss():
  """Weighted mean cross-entropy from LOG-PROBABILITIES (Trax: deprecated).

  The model must end in `LogSoftmax`; this layer computes
  `sum(-log_probs[target] * weights) / sum(weights)`. Inputs: log-probs
  [..., n_categories], targets [...] int, weights.
  """
  return cb.Serial(_CrossEntropy('CrossEntropyLoss'), _WeightedMean(),
                   name='CrossEntropyLoss', sublayers_to_print=[])


@configurable('trax.layers')
def CrossEntropyLossWithLogSoftmax():
  """`CrossEntropyLoss` with the `LogSoftmax` built in: takes logits."""
  return cb.Serial(core.LogSoftmax(), _CrossEntropy(), _WeightedMean(),
                   name='CrossEntropyLossWithLogSoftmax',
                   sublayers_to_print=[])


def BinaryCrossEntropyLoss():
  """Trax's deprecated binary cross-entropy on probabilities, then a weighted mean.

  Inputs: probabilities [batch, 1], 0/1 targets [batch, 1], weights.
  """
  return cb.Serial(_BinaryCrossEntropy(), _WeightedMean(),
                   name='BinaryCrossEntropyLoss', sublayers_to_print=[])


def CrossEntropySum():
  """Weighted sum of per-item cross-entropies from log-probabilities."""
  return cb.Serial(_CrossEntropy('CrossEntropySum'), WeightedSum(),
                   name='CrossEntropySum', sublayers_to_print=[])


def BinaryCrossEntropySum():
  """Weighted sum of Trax's binary cross-entropy (see `BinaryCrossEntropyLoss`)."""
  return cb.Serial(_BinaryCrossEntropy(), WeightedSum(),
                   name='BinaryCrossEntropySum', sublayers_to_print=[])


# --- regression losses -------------------------------------------------------


@configurable('trax.layers')
def L2Loss():
  """Weighted mean squared error: sum(w·(y - t)²) / sum(w).

  Inputs: model outputs, targets and weights, all of the same shape.
  """
  def f(model_output, targets, weights):
    _check_same_shape('L2Loss', 'model outputs', model_output, 'targets',
                      targets)
    _check_same_shape('L2Loss', 'model outputs', model_output, 'weights',
                      weights)
    model_output, targets = fastmath.promoted(model_output, targets)
    return _weighted_mean((model_output - targets)**2, weights)
  return base.Fn('L2Loss', f)


def SmoothL1Loss():
  """Weighted mean Huber loss: ½d² if d = |y - t| < 1 else d - ½.

  Inputs: model outputs, targets and weights, all of the same shape.
  """
  def f(model_output, targets, weights):
    _check_same_shape('SmoothL1Loss', 'model outputs', model_output,
                      'targets', targets)
    _check_same_shape('SmoothL1Loss', 'model outputs', model_output,
                      'weights', weights)
    model_output, targets = fastmath.promoted(model_output, targets)
    l1_dist = jnp.abs(model_output - targets)
    smooth_dist = jnp.where(l1_dist < 1, 0.5 * l1_dist**2, l1_dist - 0.5)
    return _weighted_mean(smooth_dist, weights)
  return base.Fn('SmoothL1Loss', f)


def WeightedSum():
  """sum(values * weights)."""
  return base.Fn('WeightedSum', _weighted_sum)


# --- F-scores ----------------------------------------------------------------


def _precision_recall(predictions, targets, k):
  """Per-category counts, precision and recall, summed over axis 0 as in Trax."""
  n_correct = jnp.sum((predictions == k) & (targets == k), axis=0)
  n_k_predictions = jnp.sum(predictions == k, axis=0)
  precision = _div_or_zero(n_correct, n_k_predictions)
  n_k_targets = jnp.sum(targets == k, axis=0)
  recall = _div_or_zero(n_correct, n_k_targets)
  return n_correct, n_k_predictions, n_k_targets, precision, recall


def _f_score(precision, recall, beta2):
  return _div_or_zero((beta2 + 1) * (precision * recall),
                      (beta2 * precision) + recall)


def _per_category_f_scores(model_output, targets, beta, initial_category_index):
  predictions = jnp.argmax(model_output, axis=-1)
  beta2 = beta ** 2
  f_scores, n_targets = [], []
  for k in range(initial_category_index, model_output.shape[-1]):
    _, _, n_k_targets, precision, recall = _precision_recall(
        predictions, targets, k)
    f_scores.append(jnp.ravel(_f_score(precision, recall, beta2)))
    n_targets.append(jnp.ravel(n_k_targets))
  return jnp.concatenate(f_scores), jnp.concatenate(n_targets)


@configurable('trax.layers')
def MacroAveragedFScore(beta=1., initial_category_index=0):
  """Mean over categories k >= initial_category_index of the F_beta score of k.

  Inputs: model outputs [batch, n_categories], targets [batch] int. Categories
  never predicted nor present score 0 (0/0 is taken as 0, as in Trax).
  """
  def f(model_output, targets):
    f_scores, _ = _per_category_f_scores(model_output, targets, beta,
                                         initial_category_index)
    return jnp.mean(f_scores)
  return base.Fn('MacroAveragedFScore', f)


@configurable('trax.layers')
def WeightedFScore(beta=1., initial_category_index=0):
  """F_beta scores of the categories averaged with weights = their target counts.

  Inputs: model outputs [batch, n_categories], targets [batch] int.
  """
  def f(model_output, targets):
    f_scores, n_targets = _per_category_f_scores(model_output, targets, beta,
                                                 initial_category_index)
    return jnp.average(f_scores, weights=n_targets.astype(f_scores.dtype))
  return base.Fn('WeightedFScore', f)
