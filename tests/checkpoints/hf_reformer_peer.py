"""Runs in the torch peer venv (transformers): builds or loads HF Reformers for
tests/checkpoints/test_hf_reformer.py and writes their logits.

    python hf_reformer_peer.py build SPEC.json OUT   # one HF dir + logits per model
    python hf_reformer_peer.py load HF_DIR IDS.npy ROTATIONS.npy LOGITS.npy

`build` reads `{name: ReformerConfig kwargs}`, gives each model random weights
(all of them, LayerNorms and biases too), saves it with save_pretrained to
OUT/name, and writes OUT/name.logits.npy: eval-mode logits of OUT/ids.npy.
LSH hashing draws its rotations with torch.randn; here they are the fixed
array OUT/rotations.npy (the same for every head), so that retrax, given the
same rotations, must hash alike.
"""

import json
import os
import sys

import numpy as np
import torch
from transformers import ReformerConfig
from transformers import ReformerModelWithLMHead

RANDN = torch.randn


def fix_rotations(rotations):
  """Makes HF's LSH draw `rotations [d, n_hashes, r]` for every head."""
  fixed = torch.from_numpy(rotations)

  def randn(*shape, **kwargs):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
      shape = tuple(shape[0])
    if tuple(shape[1:]) == tuple(fixed.shape):
      return fixed[None].expand(shape).to(kwargs.get('dtype') or
                                          torch.float32).clone()
    return RANDN(*shape, **kwargs)
  torch.randn = randn


def logits_of(model, ids):
  with torch.no_grad():
    return model(torch.from_numpy(ids)).logits.numpy()


def randomize(model, seed):
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if 'layer_norm.weight' in name:
        p.copy_(1.0 + 0.2 * noise)
      elif name.endswith('bias'):
        p.copy_(0.2 * noise)
      else:
        p.copy_(0.5 * noise)


def build(spec_file, out):
  with open(spec_file) as f:
    spec = json.load(f)
  fix_rotations(np.load(os.path.join(out, 'rotations.npy')))
  ids = np.load(os.path.join(out, 'ids.npy'))
  for i, (name, kwargs) in enumerate(sorted(spec.items())):
    model = ReformerModelWithLMHead(ReformerConfig(**kwargs))
    randomize(model, seed=i)
    model.eval()
    model.save_pretrained(os.path.join(out, name))
    np.save(os.path.join(out, name + '.logits.npy'), logits_of(model, ids))


def load(hf_dir, ids_file, rotations_file, logits_file):
  fix_rotations(np.load(rotations_file))
  model = ReformerModelWithLMHead.from_pretrained(hf_dir)
  model.eval()
  np.save(logits_file, logits_of(model, np.load(ids_file)))


if __name__ == '__main__':
  {'build': build, 'load': load}[sys.argv[1]](*sys.argv[2:])
