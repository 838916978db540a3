"""Metric and loss layers against NumPy references and Trax's metrics_test values."""

import jax
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import core
from retrax.layers import metrics
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance
from tests.float64 import float64

RS = np.random.RandomState(0)
LOGITS = RS.randn(3, 5, 7).astype(np.float32)
TARGETS = RS.randint(0, 7, size=(3, 5)).astype(np.int32)
WEIGHTS = (RS.rand(3, 5) > 0.3).astype(np.float32) * RS.rand(3, 5).astype(
    np.float32)


# Tests that feed raw logits to CrossEntropyLoss on purpose.
_RAW_LOGITS_OK = 'ignore::retrax.layers.tutorial_checks.LogProbabilitiesWarning'


def np_log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_one_hot(t, n):
  return (np.asarray(t)[..., None] == np.arange(n)).astype(np.float64)


def np_category_ce(logits, targets, label_smoothing=None, cutoff=0.0):
  n = logits.shape[-1]
  dist = np_one_hot(targets, n)
  if label_smoothing:
    dist = dist * (1 - label_smoothing) + label_smoothing / n
  ce = -(dist * np_log_softmax(logits)).sum(-1)
  return np.maximum(ce, cutoff) - cutoff if cutoff > 0 else ce


def close(actual, expected, rtol=1e-5):
  np.testing.assert_allclose(np.asarray(actual), expected,
                             **float32_tolerance(rtol=rtol, atol=1e-7))


# --- category metrics ---------------------------------------------------------


def test_category_cross_entropy():
  close(metrics.CategoryCrossEntropy()([LOGITS, TARGETS]),
        np_category_ce(LOGITS, TARGETS).mean())
  close(metrics.CategoryCrossEntropy(label_smoothing=0.1)([LOGITS, TARGETS]),
        np_category_ce(LOGITS, TARGETS, 0.1).mean())
  layer = metrics.CategoryCrossEntropy()
  t = np.array([0, 1])
  assert layer([np.array([[9., 2., 0., -2.], [2., 9., 0., -2.]]), t]) == (
      pytest.approx(.001, abs=5e-4))
  assert layer([np.array([[2.2, 2., 0., -2.], [2., 2.2, 0., -2.]]), t]) == (
      pytest.approx(.665, abs=5e-4))
  smoothed = metrics.CategoryCrossEntropy(label_smoothing=0.01)
  assert smoothed([np.array([[9., 2., 0., -2.], [2., 2.2, 0., -2.]]), t]) == (
      pytest.approx(.375, abs=5e-4))
  assert repr(layer) == 'CategoryCrossEntropy_in2'


def test_weighted_category_cross_entropy():
  for smoothing, cutoff in [(None, 0.0), (0.2, 0.0), (None, 1.5)]:
    layer = metrics.WeightedCategoryCrossEntropy(label_smoothing=smoothing,
                                                 cutoff=cutoff)
    ce = np_category_ce(LOGITS, TARGETS, smoothing, cutoff)
    close(layer([LOGITS, TARGETS, WEIGHTS]), (ce * WEIGHTS).sum() / WEIGHTS.sum())
  layer = metrics.WeightedCategoryCrossEntropy()
  t, w = np.array([0, 1]), np.array([30, 10])
  assert layer([np.array([[9., 2., 0., -2.], [2., 2.2, 0., -2.]]), t, w]) == (
      pytest.approx(.167, abs=5e-4))
  smoothed = metrics.WeightedCategoryCrossEntropy(label_smoothing=0.01)
  assert smoothed([np.array([[9., 2., 0., -2.], [2., 2.2, 0., -2.]]), t, w]) == (
      pytest.approx(.222, abs=5e-4))
  assert repr(layer) == 'WeightedCategoryCrossEntropy_in3'
  with pytest.raises(base.LayerError, match='between 0 and 1'):
    metrics.WeightedCategoryCrossEntropy(label_smoothing=1.5)(
        [LOGITS, TARGETS, WEIGHTS])


def test_category_cross_entropy_keeps_the_logits_wider_dtype():
  # Under the suite's strict promotion: float32 one-hot targets against
  # float64 logits give float64 (gradient checks), against bfloat16 float32.
  with float64():
    got = metrics.CategoryCrossEntropy()([LOGITS.astype(np.float64), TARGETS])
    assert got.dtype == np.float64
    close(got, np_category_ce(LOGITS.astype(np.float64), TARGETS).mean(),
          rtol=1e-12)
  low = jax.numpy.asarray(LOGITS, jax.numpy.bfloat16)
  got = metrics.WeightedCategoryCrossEntropy(label_smoothing=0.1)(
      [low, TARGETS, WEIGHTS])
  assert got.dtype == np.float32
  ce = np_category_ce(np.asarray(low, np.float32), TARGETS, 0.1)
  close(got, (ce * WEIGHTS).sum() / WEIGHTS.sum(), rtol=1e-2)


def test_category_accuracy_and_weighted():
  preds = np.argmax(LOGITS, -1)
  close(metrics.CategoryAccuracy()([LOGITS, TARGETS]), (preds == TARGETS).mean())
  close(metrics.WeightedCategoryAccuracy()([LOGITS, TARGETS, WEIGHTS]),
        ((preds == TARGETS) * WEIGHTS).sum() / WEIGHTS.sum())
  targets = np.array([0, 1, 2])
  outs = np.array([[.2, .7, .1, 0.]] * 3)
  assert metrics.WeightedCategoryAccuracy()(
      [outs, targets, np.array([1., 5., 2.])]) == .625
  assert metrics.CategoryAccuracy()([outs, targets]) == pytest.approx(1 / 3)
  assert repr(metrics.CategoryAccuracy()) == 'CategoryAccuracy_in2'


def test_accuracy_serial_layer():
  preds = np.argmax(LOGITS, -1)
  close(metrics.Accuracy()([LOGITS, TARGETS, WEIGHTS]),
        ((preds == TARGETS) * WEIGHTS).sum() / WEIGHTS.sum())
  outs = np.array([[.7, .2, .1, 0.]] * 3)
  assert metrics.Accuracy()([outs, np.array([0, 1, 2]),
                             np.array([1., 5., 2.])]) == .125
  layer = metrics.Accuracy(classifier=core.ThresholdToBinary())
  targets = np.array([[0, 0, 1, 1], [1, 1, 1, 0]])
  outs = np.array([[.498, .499, .500, .501], [.502, .501, .500, .499]])
  assert layer([outs, targets, np.ones_like(targets)]) == .75
  assert repr(metrics.Accuracy()) == 'Accuracy_in3'
  assert [l.name for l in metrics.Accuracy().sublayers] == [
      'ArgMax', '_Accuracy', '_WeightedMean']
  w, s = metrics.Accuracy().init(
      (ShapeDtype((3, 4)), ShapeDtype((3,), np.int32), ShapeDtype((3,))))
  assert (w, s) == (((), (), ()), ((), (), ()))


def test_sequence_accuracies():
  targets = np.array([[0, 1, 0, 0], [1, 0, 1, 0]])
  weights = np.array([[1., 1., 1., 0.], [1., 1., 1., 0.]])
  cases = [
      (np.array([[[.9, .1], [.2, .8], [.7, .3], [.35, .65]],
                 [[.3, .7], [.8, .2], [.1, .9], [.35, .65]]]), 1.),
      (np.array([[[.45, .55], [.2, .8], [.7, .3], [.6, .4]],
                 [[.3, .7], [.8, .2], [.1, .9], [.6, .4]]]), .5),
      (np.array([[[.9, .1], [.2, .8], [.48, .52], [.6, .4]],
                 [[.3, .7], [.8, .2], [.51, .49], [.6, .4]]]), 0.),
  ]
  for outs, expected in cases:
    assert metrics.MaskedSequenceAccuracy()([outs, targets, weights]) == expected
    assert metrics.SequenceAccuracy()([outs, targets, weights]) == expected
  # Against a reference on random data.
  preds = np.argmax(LOGITS, -1)
  mask = WEIGHTS > 0
  ref = np.all((preds == TARGETS) | ~mask, axis=-1).mean()
  close(metrics.MaskedSequenceAccuracy()([LOGITS, TARGETS, WEIGHTS]), ref)
  close(metrics.SequenceAccuracy()([LOGITS, TARGETS, mask.astype(np.float32)]),
        ref)
  assert repr(metrics.SequenceAccuracy()) == 'SequenceAccuracy_in3'
  assert repr(metrics.MaskedSequenceAccuracy()) == 'MaskedSequenceAccuracy_in3'


# --- cross-entropy from log-probabilities (Trax's older losses) ----------------


@pytest.mark.filterwarnings(_RAW_LOGITS_OK)
def test_cross_entropy_loss_expects_log_probs():
  log_probs = np_log_softmax(LOGITS).astype(np.float32)
  ce = -(np_one_hot(TARGETS, 7) * log_probs).sum(-1)
  close(metrics.CrossEntropyLoss()([log_probs, TARGETS, WEIGHTS]),
        (ce * WEIGHTS).sum() / WEIGHTS.sum())
  # Given raw logits it does NOT normalize: -logit[target], weighted.
  raw = -(np_one_hot(TARGETS, 7) * LOGITS).sum(-1)
  close(metrics.CrossEntropyLoss()([LOGITS, TARGETS, WEIGHTS]),
        (raw * WEIGHTS).sum() / WEIGHTS.sum())
  close(metrics.CrossEntropyLossWithLogSoftmax()([LOGITS, TARGETS, WEIGHTS]),
        (ce * WEIGHTS).sum() / WEIGHTS.sum())
  close(metrics.CrossEntropySum()([log_probs, TARGETS, WEIGHTS]),
        (ce * WEIGHTS).sum())
  assert repr(metrics.CrossEntropyLoss()) == 'CrossEntropyLoss_in3'
  assert repr(metrics.CrossEntropyLossWithLogSoftmax()) == (
      'CrossEntropyLossWithLogSoftmax_in3')
  assert repr(metrics.CrossEntropySum()) == 'CrossEntropySum_in3'
  assert [l.name for l in metrics.CrossEntropyLoss().sublayers] == [
      '_CrossEntropy', '_WeightedMean']
  assert [l.name for l in metrics.CrossEntropyLossWithLogSoftmax().sublayers
         ] == ['LogSoftmax', '_CrossEntropy', '_WeightedMean']
  xs = [np.ones((9, 4, 4, 20)), np.ones((9, 4, 4)), np.ones((9, 4, 4))]
  assert metrics.CrossEntropyLoss()(xs).shape == ()


def test_cross_entropy_loss_checks_target_shape():
  with pytest.raises(base.LayerError, match=r'targets should have shape \(3, 5\)'):
    metrics.CrossEntropyLoss()([LOGITS, TARGETS[:, :4], WEIGHTS[:, :4]])


def test_binary_cross_entropy():
  logits = RS.randn(6).astype(np.float32)
  targets = np.array([1, 0, 1, 1, 0, 0])
  p = 1 / (1 + np.exp(-logits.astype(np.float64)))
  ref = -(targets * np.log(p) + (1 - targets) * np.log(1 - p)).mean()
  close(metrics.BinaryCrossEntropy()([logits, targets]), ref)
  layer = metrics.BinaryCrossEntropy()
  t = np.array([1, 1, 0, 0, 0])
  assert layer([np.array([9., 9., -9., -9., -9.]), t]) == pytest.approx(
      0.000123, abs=5e-7)
  assert layer([np.array([-1., -1., 1., 1., 1.]), t]) == pytest.approx(
      1.313, abs=5e-4)


def test_binary_cross_entropy_loss_and_sum():
  probs = RS.uniform(0.05, 0.95, size=(8, 1)).astype(np.float32)
  targets = (RS.rand(8, 1) > 0.5).astype(np.float32)
  weights = RS.rand(8, 1).astype(np.float32) + 0.5
  p = probs.astype(np.float64)
  j = -(targets * np.log(p) + (1 - targets) * np.log(1 - p)).sum() / 8
  # Trax's _BinaryCrossEntropy gives one number for the batch, then weights it.
  close(metrics.BinaryCrossEntropyLoss()([probs, targets, weights]),
        (j * weights).sum() / weights.sum())
  close(metrics.BinaryCrossEntropySum()([probs, targets, weights]),
        (j * weights).sum())
  assert repr(metrics.BinaryCrossEntropyLoss()) == 'BinaryCrossEntropyLoss_in3'
  assert repr(metrics.BinaryCrossEntropySum()) == 'BinaryCrossEntropySum_in3'
  assert metrics.BinaryCrossEntropyLoss()([np.ones((9, 1)) * .5] * 3).shape == ()


# --- regression ------------------------------------------------------------------


def test_l2_and_smooth_l1_losses():
  y = RS.randn(4, 3).astype(np.float32) * 2
  t = RS.randn(4, 3).astype(np.float32)
  w = RS.rand(4, 3).astype(np.float32)
  d = y.astype(np.float64) - t
  close(metrics.L2Loss()([y, t, w]), (w * d ** 2).sum() / w.sum())
  a = np.abs(d)
  huber = np.where(a < 1, 0.5 * a ** 2, a - 0.5)
  close(metrics.SmoothL1Loss()([y, t, w]), (w * huber).sum() / w.sum())
  outs = np.array([[1., 1.], [1., 1.]])
  tgt = np.array([[1., 1.], [1., 0.]])
  assert metrics.L2Loss()([outs, tgt, np.array([[1., 0.], [0., 1.]])]) == .5
  assert repr(metrics.L2Loss()) == 'L2Loss_in3'
  assert repr(metrics.SmoothL1Loss()) == 'SmoothL1Loss_in3'
  with pytest.raises(base.LayerError, match='same shape'):
    metrics.L2Loss()([y, t[:, :2], w])


def test_weighted_sum():
  v, w = RS.randn(5).astype(np.float32), RS.rand(5).astype(np.float32)
  close(metrics.WeightedSum()([v, w]), (v.astype(np.float64) * w).sum())
  assert repr(metrics.WeightedSum()) == 'WeightedSum_in2'


# --- F-scores --------------------------------------------------------------------


def np_f_scores(preds, targets, n_categories, beta, start):
  scores, counts = [], []
  for k in range(start, n_categories):
    tp = np.sum((preds == k) & (targets == k))
    n_pred, n_true = np.sum(preds == k), np.sum(targets == k)
    prec = tp / n_pred if n_pred else 0.
    rec = tp / n_true if n_true else 0.
    b2 = beta ** 2
    denom = b2 * prec + rec
    scores.append((b2 + 1) * prec * rec / denom if denom else 0.)
    counts.append(n_true)
  return np.array(scores), np.array(counts)


def test_f_scores():
  outs = np.array([[0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0],
                   [0, 1, 0, 0]])
  targets = np.array([1, 2, 2, 3, 1])
  assert metrics.MacroAveragedFScore()([outs, targets]) == pytest.approx(
      .333, abs=5e-4)
  assert metrics.MacroAveragedFScore(initial_category_index=1)(
      [outs, targets]) == pytest.approx(.444, abs=5e-4)
  assert metrics.WeightedFScore()([outs, targets]) == pytest.approx(
      .533, abs=5e-4)
  logits = RS.randn(40, 6).astype(np.float32)
  labels = RS.randint(0, 6, size=40)
  preds = logits.argmax(-1)
  for beta, start in [(1., 0), (2., 1), (.5, 2)]:
    scores, counts = np_f_scores(preds, labels, 6, beta, start)
    close(metrics.MacroAveragedFScore(beta, start)([logits, labels]),
          scores.mean())
    close(metrics.WeightedFScore(beta, start)([logits, labels]),
          (scores * counts).sum() / counts.sum())
  assert repr(metrics.MacroAveragedFScore()) == 'MacroAveragedFScore_in2'
  assert repr(metrics.WeightedFScore()) == 'WeightedFScore_in2'


@pytest.mark.filterwarnings(_RAW_LOGITS_OK)
def test_metrics_jit_like_eager():
  for layer, inputs in [
      (metrics.WeightedCategoryCrossEntropy(), (LOGITS, TARGETS, WEIGHTS)),
      (metrics.CrossEntropyLoss(), (LOGITS, TARGETS, WEIGHTS)),
      (metrics.Accuracy(), (LOGITS, TARGETS, WEIGHTS)),
      (metrics.MacroAveragedFScore(), (LOGITS[0], TARGETS[0])),
  ]:
    weights, state = layer.init(inputs)
    eager, _ = layer.pure_fn(inputs, weights, state, None)
    jitted, _ = jax.jit(layer.pure_fn)(inputs, weights, state,
                                       jax.random.PRNGKey(0))
    close(jitted, eager, rtol=1e-6)
