"""ReformerLM's docstring documents every argument it takes (an `Args:`
entry per parameter), so readers and the API reference see them all."""

import inspect
import re

from retrax import models


def test_reformer_lm_documents_every_argument():
  fn = inspect.unwrap(models.ReformerLM)
  doc = inspect.getdoc(fn)
  args = doc.split('Args:\n', 1)[1].split('\n\n', 1)[0]
  documented = re.findall(r'^  (\w+):', args, re.M)
  assert documented == list(inspect.signature(fn).parameters)
