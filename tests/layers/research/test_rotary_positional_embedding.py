"""Rotate: closed-form rotation, relative-position property, errors."""

import numpy as np
import pytest

from retrax import layers as tl
from retrax.layers.research import rotary_positional_embedding as rotary


def test_rotation_closed_form():
  x = np.random.RandomState(0).randn(2, 5, 6).astype(np.float32)
  y = np.asarray(tl.Rotate()(x))
  for p in range(5):
    for i in range(3):
      theta = p * 10000.0**(-2 * i / 6)
      a, b = x[:, p, i], x[:, p, i + 3]
      np.testing.assert_allclose(y[:, p, i], a * np.cos(theta) -
                                 b * np.sin(theta), atol=1e-5)
      np.testing.assert_allclose(y[:, p, i + 3], b * np.cos(theta) +
                                 a * np.sin(theta), atol=1e-5)


def test_dot_products_depend_on_relative_position_only():
  rs = np.random.RandomState(1)
  q, k = rs.randn(1, 1, 8).astype(np.float32), rs.randn(1, 1, 8).astype(
      np.float32)
  qs = np.asarray(rotary.rotate(np.repeat(q, 12, axis=1)))[0]
  ks = np.asarray(rotary.rotate(np.repeat(k, 12, axis=1)))[0]
  dots = qs @ ks.T
  np.testing.assert_allclose(dots[3, 1], dots[9, 7], rtol=1e-4)
  np.testing.assert_allclose(dots[2, 5], dots[6, 9], rtol=1e-4)
  np.testing.assert_allclose(np.linalg.norm(qs, axis=-1),
                             np.full(12, np.linalg.norm(q)), rtol=1e-5)


def test_odd_depth_is_refused():
  with pytest.raises(tl.LayerError, match='even'):
    tl.Rotate()(np.zeros((1, 2, 5), np.float32))
