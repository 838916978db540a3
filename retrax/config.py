"""Run configuration for the CLI: a frozen dataclass, TOML files and `--set key=value` overrides."""

import dataclasses
import json
import math
import os
import sys

if sys.version_info >= (3, 11):
  import tomllib
else:  # pragma: no cover
  import tomli as tomllib


class ConfigError(ValueError):
  """A bad configuration: unknown key, wrong type, unreadable file."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What `retrax train` builds and runs. Defaults: the default job.

  The default job trains a small ReformerLM with LSH attention on the
  Reformer paper's duplication task (`0 w 0 w`, loss on the second `w`).
  """
  model: str = 'ReformerLM'         # ReformerLM | TransformerLM
  attention: str = 'lsh'            # lsh | local | full (ReformerLM only)
  data: str = 'duplication'         # duplication | text:PATH
  tokenizer: str = 'bytes'          # text: bytes | sentencepiece:MODEL_FILE
  eval_fraction: float = 0.1        # text: held-out share (end of the file)
  vocab_size: int = 32
  length: int = 32                  # sequence length (duplication: 2*(|w|+1))
  d_model: int = 64
  d_ff: int = 128
  n_layers: int = 2
  n_heads: int = 2
  d_head: int = 32
  n_hashes: int = 2
  chunk_len: int = 8
  dropout: float = 0.0
  batch_size: int = 32
  steps: int = 3000
  eval_every: int = 250
  checkpoint_every: int = 250
  learning_rate: float = 2e-3
  warmup_steps: int = 200
  seed: int = 0
  output_dir: str = 'runs/duplication'
  n_samples: int = 4
  trax_files: bool = True           # also write Trax's model.pkl.gz files

  def replace(self, **kwargs):
    return dataclasses.replace(self, **kwargs)

  def to_dict(self):
    return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _coerce(key, value):
  """Converts a string (from --set) or TOML value to the field's type."""
  if key not in FIELDS:
    raise ConfigError(f'unknown config key {key!r}; known keys: '
                      f'{", ".join(sorted(FIELDS))}')
  kind = type(getattr(RunConfig(), key))
  if isinstance(value, str) and kind is str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in '"\'':
      value = value[1:-1]
  elif isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise ConfigError(f'{key}: cannot read {value!r} as {kind.__name__}') from e
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise ConfigError(f'{key} must be {kind.__name__}; got {value!r}')
  return value


def load(path=None, overrides=(), base=None):
  """Builds a RunConfig from defaults, a TOML file and `key=value` overrides."""
  values = {}
  if path is not None:
    if not os.path.isfile(path):
      raise ConfigError(f'config file {path!r} does not exist')
    with open(path, 'rb') as f:
      try:
        data = tomllib.load(f)
      except tomllib.TOMLDecodeError as e:
        raise ConfigError(f'{path}: not valid TOML: {e}') from e
    for key, value in data.items():
      values[key] = _coerce(key, value)
  for item in overrides:
    if '=' not in item:
      raise ConfigError(f'--set expects key=value; got {item!r}')
    key, value = item.split('=', 1)
    values[key.strip()] = _coerce(key.strip(), value.strip())
  config = (base or RunConfig()).replace(**values)
  validate(config)
  if config.data.startswith('text:'):
    config = _with_text_vocab(config, 'vocab_size' in values)
  return config


def _with_text_vocab(config, vocab_given):
  """Sets vocab_size from the tokenizer (an explicit different one is an error)."""
  from retrax.data import tasks  # pylint: disable=g-import-not-at-top
  try:
    vocab = tasks.TextTokenizer(config.tokenizer).vocab_size
  except (ValueError, ImportError, FileNotFoundError) as e:
    raise ConfigError(f'tokenizer: {e}') from e
  if vocab_given and config.vocab_size != vocab:
    raise ConfigError(
        f'vocab_size={config.vocab_size} but the tokenizer {config.tokenizer!r} '
        f'has {vocab} ids; leave vocab_size out for text data (it is taken '
        'from the tokenizer).')
  return config.replace(vocab_size=vocab)


def validate(config):
  """Raises ConfigError for inconsistent settings."""
  if config.model not in ('ReformerLM', 'TransformerLM'):
    raise ConfigError(f"model must be 'ReformerLM' or 'TransformerLM'; got "
                      f'{config.model!r}')
  if config.attention not in ('lsh', 'local', 'full'):
    raise ConfigError(f"attention must be 'lsh', 'local' or 'full'; got "
                      f'{config.attention!r}')
  if config.data != 'duplication' and not config.data.startswith('text:'):
    raise ConfigError(f"data must be 'duplication' or 'text:PATH'; got "
                      f'{config.data!r}')
  if config.data.startswith('text:') and not os.path.exists(config.data[5:]):
    raise ConfigError(f'text data path {config.data[5:]!r} does not exist')
  if config.tokenizer != 'bytes' and not config.data.startswith('text:'):
    raise ConfigError(f'tokenizer applies to text data (--data text:PATH); '
                      f'got tokenizer={config.tokenizer!r} with data='
                      f'{config.data!r}')
  if not config.tokenizer == 'bytes' and not config.tokenizer.startswith(
      'sentencepiece:'):
    raise ConfigError(f"tokenizer must be 'bytes' or 'sentencepiece:MODEL_FILE'"
                      f'; got {config.tokenizer!r}')
  if not 0 < config.eval_fraction < 1:
    raise ConfigError(f'eval_fraction must be in (0, 1); got '
                      f'{config.eval_fraction}')
  if config.length % 2 or config.length < 4:
    raise ConfigError(f'length must be even and >= 4; got {config.length}')
  if (config.attention != 'full' and config.chunk_len >= 1 and
      config.length % config.chunk_len):
    raise ConfigError(f'length ({config.length}) must be a multiple of '
                      f'chunk_len ({config.chunk_len})')
  for key in ('vocab_size', 'd_model', 'd_ff', 'n_layers', 'n_heads', 'd_head',
              'n_hashes', 'chunk_len', 'batch_size', 'steps', 'eval_every',
              'checkpoint_every'):
    if getattr(config, key) < 1:
      raise ConfigError(f'{key} must be >= 1; got {getattr(config, key)}')
  if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
    raise ConfigError(f'learning_rate must be a finite number > 0; got '
                      f'{config.learning_rate}')
  if not 0 <= config.dropout < 1:
    raise ConfigError(f'dropout must be in [0, 1); got {config.dropout}')
  if config.warmup_steps < 0:
    raise ConfigError(f'warmup_steps must be >= 0; got {config.warmup_steps}')
  if config.model == 'TransformerLM' and config.d_model % config.n_heads:
    raise ConfigError(f'd_model ({config.d_model}) must be a multiple of '
                      f'n_heads ({config.n_heads}) for TransformerLM')
