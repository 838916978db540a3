"""Run configuration for the CLI: typed sections, TOML files and overrides.

A `RunConfig` holds four frozen sections: `model` (`ModelConfig`), `data`
(`DataConfig`), `train` (`TrainConfig`) and `sample` (`SampleConfig`). Users
name settings by flat keys (`--set d_model=64`, a TOML file's `d_model = 64`,
the keys of a run's `run_config.json`); `section.field` names (`--set
model.d_model=64`, TOML tables such as `[model]`) are accepted too. `KEYS`
maps each flat key to its section and field.
"""

import dataclasses
import json
import math
import os
import tomllib
import typing

from retrax import suggest
from retrax.errors import UserInputError


class ConfigError(UserInputError):
  """A bad configuration: unknown key, wrong type, unreadable file."""


def _key(default, help_text, key=None):
  """A section field: its default, `--help` text and flat key (default: its name)."""
  return dataclasses.field(default=default,
                           metadata={'help': help_text, 'key': key})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model: ReformerLM (LSH, local or full attention) or TransformerLM."""
  name: str = _key('ReformerLM', 'ReformerLM | TransformerLM', key='model')
  attention: str = _key('lsh', 'lsh | local | full (ReformerLM only)')
  vocab_size: int = _key(32, 'token ids (text data: from the tokenizer)')
  length: int = _key(32, 'sequence length (duplication: 2*(|w|+1))')
  d_model: int = _key(64, 'model width')
  d_ff: int = _key(128, 'feed-forward width')
  n_layers: int = _key(2, 'decoder blocks')
  n_heads: int = _key(2, 'attention heads')
  d_head: int = _key(32, 'ReformerLM: key/value width per head')
  n_hashes: int = _key(2, 'lsh attention: hash rounds')
  chunk_len: int = _key(8, 'lsh/local attention: chunk length')
  dropout: float = _key(0.0, 'dropout rate in [0, 1)')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data: the duplication task or a text file."""
  source: str = _key('duplication', "'duplication' or 'text:PATH'", key='data')
  tokenizer: str = _key('bytes', "text data: 'bytes' or "
                        "'sentencepiece:MODEL_FILE'")
  eval_fraction: float = _key(0.1, 'text data: held-out share (end of file)')
  batch_size: int = _key(32, 'rows per batch')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The training run."""
  steps: int = _key(3000, 'training steps')
  eval_every: int = _key(250, 'steps between evals')
  checkpoint_every: int = _key(250, 'steps between checkpoints')
  learning_rate: float = _key(2e-3, 'Adam learning rate (> 0)')
  warmup_steps: int = _key(200, 'linear warmup steps (0: none)')
  seed: int = _key(0, 'random seed (model and data)')
  output_dir: str = _key('runs/duplication', 'run directory')
  trax_files: bool = _key(True, "also write Trax's model.pkl.gz files")
  matmul_dtype: str = _key('float32', "matmul operands: 'float32' or "
                           "'bfloat16' (float32 sums; faster on AMX/GPU)")
  log_every: int = _key(0, 'steps between training-metric logs (mean loss, '
                        'learning rate, steps/s) to metrics.jsonl, TensorBoard '
                        'and report_to (0: at evals only)')
  report_to: str = _key('', "also send the logged metrics to 'wandb', "
                        "'mlflow' or 'wandb,mlflow' (pip install "
                        '"retrax[wandb]" / "retrax[mlflow]")')


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """Sampling after training."""
  n_samples: int = _key(4, 'samples printed after training (0: none)')
  temperature: float = _key(0.0, 'sampling temperature of those samples (0: '
                            'greedy; text runs continue held-out text)')


SECTIONS = {'model': ModelConfig, 'data': DataConfig, 'train': TrainConfig,
            'sample': SampleConfig}


class Key(typing.NamedTuple):
  """A config key: where it lives, its type, default and help text."""
  name: str
  section: str
  field: str
  kind: type
  default: typing.Any
  help: str


def _keys():
  keys = {}
  for section, cls in SECTIONS.items():
    for f in dataclasses.fields(cls):
      name = f.metadata['key'] or f.name
      keys[name] = Key(name, section, f.name, type(f.default), f.default,
                       f.metadata['help'])
  return keys


KEYS = _keys()
# Int keys that must be >= 1.
POSITIVE_KEYS = ('vocab_size', 'd_model', 'd_ff', 'n_layers', 'n_heads',
                 'd_head', 'n_hashes', 'chunk_len', 'batch_size', 'steps',
                 'eval_every', 'checkpoint_every')
_DOTTED = {f'{k.section}.{k.field}': k for k in KEYS.values()}


def key_of(name):
  """The `Key` named `name` (flat, e.g. 'd_model', or 'model.d_model')."""
  key = KEYS.get(name) or _DOTTED.get(name)
  if key is None:
    near = suggest.nearest(name, list(KEYS) + list(_DOTTED))
    raise ConfigError(f'unknown config key {name!r}; ' + (
        f'did you mean {near!r}?' if near else
        f'known keys: {", ".join(sorted(KEYS))}'))
  return key


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What `retrax train` builds and runs. Defaults: the default job.

  The default job trains a small ReformerLM with LSH attention on the
  Reformer paper's duplication task (`0 w 0 w`, loss on the second `w`).
  """
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  sample: SampleConfig = dataclasses.field(default_factory=SampleConfig)

  def replace(self, **values):
    """A copy with settings replaced, named by flat (or dotted) keys."""
    by_section: typing.Dict[str, typing.Dict[str, typing.Any]] = {}
    for name, value in values.items():
      key = key_of(name)
      by_section.setdefault(key.section, {})[key.field] = value
    return dataclasses.replace(self, **{
        s: dataclasses.replace(getattr(self, s), **fields)
        for s, fields in by_section.items()})

  def get(self, name):
    """The value of a flat (or dotted) key."""
    key = key_of(name)
    return getattr(getattr(self, key.section), key.field)

  def to_dict(self):
    """`{flat key: value}`: the layout of a run's run_config.json."""
    return {name: self.get(name) for name in KEYS}

  @classmethod
  def from_dict(cls, values):
    """A RunConfig from flat keys (run_config.json; missing keys: defaults)."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
      raise ConfigError(f'unknown config keys {unknown}.')
    return cls().replace(**values)


def coerce(name, value, from_text=False):
  """Checks (and for `from_text`, parses) a value for the key `name`.

  Text (from `--set`) is read as JSON for non-string keys; a string key's
  value may be quoted. Ints are accepted for float keys.
  """
  kind = key_of(name).kind
  if from_text and kind is str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in '"\'':
      value = value[1:-1]
  elif from_text:
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise ConfigError(f'{name}: cannot read {value!r} as {kind.__name__}') from e
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise ConfigError(f'{name} must be {kind.__name__}; got {value!r}')
  return value


def _read_toml(path):
  """`{key: value}` of a TOML file: flat keys, or tables named by section."""
  if not os.path.isfile(path):
    raise ConfigError(f'config file {path!r} does not exist')
  with open(path, 'rb') as f:
    try:
      data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
      raise ConfigError(f'{path}: not valid TOML: {e}') from None
  values = {}
  for name, value in data.items():
    if name in SECTIONS and isinstance(value, dict):
      for field, v in value.items():
        values[key_of(f'{name}.{field}').name] = v
    else:
      values[key_of(name).name] = value
  return values


def load(path=None, overrides=(), base=None, flags=None):
  """Builds a RunConfig from defaults, a TOML file, overrides and flags.

  Args:
    path: a TOML file of config keys, or None.
    overrides: `key=value` strings (`--set`), applied after the file.
    base: the config to start from (default: `RunConfig()`).
    flags: `{key: typed value}` (the CLI's parsed options), applied last.

  Raises:
    ConfigError: an unknown key, a wrong type or an inconsistent setting.
  """
  values = {}
  if path is not None:
    for name, value in _read_toml(path).items():
      values[name] = coerce(name, value)
  for item in overrides:
    if '=' not in item:
      raise ConfigError(f'--set expects key=value; got {item!r}')
    name, value = (s.strip() for s in item.split('=', 1))
    values[key_of(name).name] = coerce(name, value, from_text=True)
  for name, value in (flags or {}).items():
    values[key_of(name).name] = coerce(name, value)
  config = (base or RunConfig()).replace(**values)
  validate(config)
  if config.data.source.startswith('text:'):
    config = _with_text_vocab(config, 'vocab_size' in values)
  return config


def open_tokenizer(spec):
  """`retrax.data.tasks.TextTokenizer(spec)`; a missing or unreadable model
  file, or no sentencepiece package, is a ConfigError."""
  from retrax.data import tasks  # Not at the top: the CLI's --help needs no data code.
  try:
    return tasks.TextTokenizer(spec)
  except (ImportError, OSError) as e:
    raise ConfigError(f'tokenizer: {e}') from e


def _with_text_vocab(config, vocab_given):
  """Sets vocab_size from the tokenizer (an explicit different one is an error)."""
  vocab = open_tokenizer(config.data.tokenizer).vocab_size
  if vocab_given and config.model.vocab_size != vocab:
    raise ConfigError(
        f'vocab_size={config.model.vocab_size} but the tokenizer '
        f'{config.data.tokenizer!r} has {vocab} ids; leave vocab_size out for '
        'text data (it is taken from the tokenizer).')
  return config.replace(vocab_size=vocab)


def help_text():
  """Every config key with its default and meaning, by section (for --help)."""
  lines = ['config keys (--set KEY=VALUE, a --config TOML file, or the '
           'options above):']
  for section in SECTIONS:
    lines.append(f'  [{section}]')
    for key in KEYS.values():
      if key.section == section:
        lines.append(f'    {key.name} = {json.dumps(key.default)}  '
                     f'# {key.help}')
  return '\n'.join(lines)


def validate(config):
  """Raises ConfigError for inconsistent settings."""
  _validate_choices(config.model, config.data)
  m, d, t = config.model, config.data, config.train
  if not 0 < d.eval_fraction < 1:
    raise ConfigError(f'eval_fraction must be in (0, 1); got {d.eval_fraction}')
  if m.length % 2 or m.length < 4:
    raise ConfigError(f'length must be even and >= 4; got {m.length}')
  if m.attention != 'full' and m.chunk_len >= 1 and m.length % m.chunk_len:
    raise ConfigError(f'length ({m.length}) must be a multiple of '
                      f'chunk_len ({m.chunk_len})')
  for name in POSITIVE_KEYS:
    if config.get(name) < 1:
      raise ConfigError(f'{name} must be >= 1; got {config.get(name)}')
  if not (math.isfinite(t.learning_rate) and t.learning_rate > 0):
    raise ConfigError(f'learning_rate must be a finite number > 0; got '
                      f'{t.learning_rate}')
  if not (math.isfinite(config.sample.temperature) and
          config.sample.temperature >= 0):
    raise ConfigError(f'temperature must be a finite number >= 0; got '
                      f'{config.sample.temperature}')
  if not 0 <= m.dropout < 1:
    raise ConfigError(f'dropout must be in [0, 1); got {m.dropout}')
  if t.matmul_dtype not in ('float32', 'bfloat16'):
    raise ConfigError(f"matmul_dtype must be 'float32' or 'bfloat16'; got "
                      f'{t.matmul_dtype!r}')
  if not 0 <= t.seed < 2 ** 32:  # What numpy's and JAX's seeds take.
    raise ConfigError(f'seed must be in [0, 2**32); got {t.seed}')
  if t.warmup_steps < 0:
    raise ConfigError(f'warmup_steps must be >= 0; got {t.warmup_steps}')
  if t.log_every < 0:
    raise ConfigError(f'log_every must be >= 0 (0: at evals only); got '
                      f'{t.log_every}')
  if m.name == 'TransformerLM' and m.d_model % m.n_heads:
    raise ConfigError(f'd_model ({m.d_model}) must be a multiple of '
                      f'n_heads ({m.n_heads}) for TransformerLM')


def _validate_choices(model, data):
  """The model, attention, data and tokenizer names."""
  if model.name not in ('ReformerLM', 'TransformerLM'):
    raise ConfigError(f"model must be 'ReformerLM' or 'TransformerLM'; got "
                      f'{model.name!r}')
  if model.attention not in ('lsh', 'local', 'full'):
    raise ConfigError(f"attention must be 'lsh', 'local' or 'full'; got "
                      f'{model.attention!r}')
  text = data.source.startswith('text:')
  if data.source != 'duplication' and not text:
    raise ConfigError(f"data must be 'duplication' or 'text:PATH'; got "
                      f'{data.source!r}')
  if text and not os.path.exists(data.source[5:]):
    raise ConfigError(f'text data path {data.source[5:]!r} does not exist')
  if data.tokenizer != 'bytes' and not text:
    raise ConfigError(f'tokenizer applies to text data (--data text:PATH); '
                      f'got tokenizer={data.tokenizer!r} with data='
                      f'{data.source!r}')
  if data.tokenizer != 'bytes' and not data.tokenizer.startswith(
      'sentencepiece:'):
    raise ConfigError(f"tokenizer must be 'bytes' or 'sentencepiece:MODEL_FILE'"
                      f'; got {data.tokenizer!r}')
