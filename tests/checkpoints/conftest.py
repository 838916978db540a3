"""Fixtures for checkpoint tests: the golden Trax files and stand-in Trax modules."""

import json

import pytest

from checkpoint_testlib import GOLDEN
from checkpoint_testlib import install_fake_trax


@pytest.fixture
def golden():
  return GOLDEN


@pytest.fixture
def golden_config():
  return json.loads((GOLDEN / 'config.json').read_text())


@pytest.fixture
def fake_trax(monkeypatch):
  """Modules named like Trax's (see `install_fake_trax`), removed afterwards."""
  return install_fake_trax(monkeypatch)
