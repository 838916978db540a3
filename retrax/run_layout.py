"""The files of a run directory: every name, and the module that writes it.

A run directory (`retrax train --output_dir`, `python -m retrax.trainer
--output_dir`, a `training.Loop`'s `output_dir`, the output of `retrax
convert`) holds only these entries; every module that writes or looks for
one of them takes its name from here. Whoever wrote it, a run holds
`model.json` and a checkpoint recording its input signature, which is all
`retrax.load_run`, `retrax sample` and `retrax eval` need; its data is
recorded by `run_config.json` or `config.gin` (`retrax.runs.data`; other runs
take `eval --data`), and `metrics.jsonl` is what `retrax plot` draws:

  retrax.lock       LOCK_FILE: one writer at a time (`checkpoints.ownership`)
  run_config.json   CONFIG_FILE: the CLI's `RunConfig` (`jobs`)
  tokenizer.model   TOKENIZER_FILE: a text run's SentencePiece model (`jobs`),
                    or a converted Hugging Face model's `spiece.model`
                    (`hf_runs`)
  model.json        MODEL_FILE: the model's constructor (`models.registry`)
  ckpt_<step>/      ROLLING_PREFIX: rolling native checkpoints
  model_<step>/     PERMANENT_PREFIX: permanent native checkpoints
  model.pkl.gz      TRAX_BASENAME: Trax's checkpoint file set (with
                    model.weights.npy.gz and model.opt_slots<i>.npy.gz;
                    model_<step>.* for permanent ones)
                    (`supervised.checkpointing`)
  metrics.jsonl     METRICS_FILE: every logged scalar (`supervised.metrics_log`)
  run_files.json    RUN_FILES: the log files runs here created, claimed
                    before they are created (`supervised.metrics_log`)
  train/, eval/,    TensorBoard event files (`events.out.tfevents.*`), one
  <task name>/      folder per task (`supervised.run_dir`)
  hf_config.json    HF_CONFIG_COPY: a converted Hugging Face model's config
                    (`hf_runs`)
  config.gin        GIN_CONFIG_FILE: a gin run's bindings (`trainer`)
  mlruns/           MLFLOW_STORE: MLflow's file store, for `report_to='mlflow'`
                    where MLflow is set to no store (`supervised.reporters`)
  wandb/            W&B's files, for `report_to='wandb'` without WANDB_DIR
                    (written by W&B; `supervised.reporters`)

Temporary files of atomic writes (`checkpoints.atomic`) appear beside the
entry they replace while it is written.
"""

import re

LOCK_FILE = 'retrax.lock'
CONFIG_FILE = 'run_config.json'
TOKENIZER_FILE = 'tokenizer.model'
MODEL_FILE = 'model.json'
ROLLING_PREFIX = 'ckpt_'
PERMANENT_PREFIX = 'model_'
TRAX_BASENAME = 'model'
METRICS_FILE = 'metrics.jsonl'
RUN_FILES = 'run_files.json'
EVENTS_PREFIX = 'events.out.tfevents.'
HF_CONFIG_COPY = 'hf_config.json'
GIN_CONFIG_FILE = 'config.gin'
MLFLOW_STORE = 'mlruns'

_CHECKPOINT_RE = re.compile(
    f'^(?:{ROLLING_PREFIX}|{PERMANENT_PREFIX})\\d+$')
_TRAX_RE = re.compile(f'^{TRAX_BASENAME}(?:_\\d+)?'
                      r'(?:\.pkl|\.weights\.npy|\.opt_slots\d+\.npy)\.gz$')


def is_checkpoint(name):
  """Whether `name` is a native checkpoint directory's (`ckpt_<step>`, `model_<step>`)."""
  return bool(_CHECKPOINT_RE.match(name))


def is_run_file(name):
  """Whether `name` is a file listed above (outside the TensorBoard folders)."""
  return (name in (LOCK_FILE, CONFIG_FILE, TOKENIZER_FILE, MODEL_FILE,
                   METRICS_FILE, RUN_FILES, HF_CONFIG_COPY,
                   GIN_CONFIG_FILE) or
          bool(_TRAX_RE.match(name)))
