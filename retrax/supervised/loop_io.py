"""`Loop`'s files: checkpoints, metric logs and console output (a mixin)."""

import logging
import os

import jax.numpy as jnp
import numpy as np

from retrax import checkpoints as ckpt_lib
from retrax import local_paths
from retrax.supervised import checkpointing
from retrax.supervised import history as trax_history
from retrax.supervised import metrics_log
from retrax.supervised import progress

_log = logging.getLogger('retrax.supervised')


def make_progress_bar(loop, n_steps, enabled=None):
  """The progress bar for `loop.run(n_steps)` (see `progress.Progress`)."""
  if enabled is None:
    enabled = loop._progress_bar_setting  # pylint: disable=protected-access
  if not loop.is_chief:
    enabled = False
  return progress.Progress(n_steps, enabled=enabled, initial=loop.step)


def _task_dir(output_dir, tasks, index):
  if len(tasks) < 2:
    return output_dir
  return os.path.join(output_dir, tasks[index].export_prefix or str(index))


class LoopIO:
  """Output and checkpoint methods of `Loop` (which provides the state)."""

  # --- logs ------------------------------------------------------------------

  def _open_output_dir(self, output_dir):
    self._output_dir = None if output_dir is None else os.path.expanduser(
        local_paths.check_local(os.fspath(output_dir), 'Loop: output_dir'))
    self._jsonl = None
    self._writers = None
    self._run_files = None
    if self._output_dir is None:
      return
    os.makedirs(self._output_dir, exist_ok=True)
    if self._is_chief:
      self._run_files = metrics_log.RunFiles(self._output_dir)
      self._jsonl = metrics_log.JsonlWriter(
          os.path.join(self._output_dir, metrics_log.METRICS_FILE),
          on_create=self._claim_log)

  def _claim_log(self, path):
    self._run_files.claim(os.path.relpath(path, self._output_dir))

  def _resume_or_start(self):
    """Resumes from `output_dir` if it holds a checkpoint, else starts afresh;
    either way cuts the run's own logs back to the step and removes temporary
    files that killed writes left."""
    if self._output_dir is None:
      return
    if self._is_chief:
      checkpointing.remove_orphans(self._output_dir, self._run_files.files())
    if self.load_checkpoint() is None:
      self._truncate_logs(0)  # A fresh run: drop logs of an unsaved one.

  def _open_writers(self):
    """Enables TensorBoard writers (`<dir>/train`, `<dir>/eval` per task),
    each created when first used."""
    self._writers = ({} if self._output_dir is not None and self._is_chief
                     else None)

  def _writer(self, kind, index):
    if self._writers is None:
      return None
    if (kind, index) not in self._writers:
      tasks = self._tasks if kind == 'train' else self._eval_tasks
      self._writers[kind, index] = metrics_log.EventWriter(os.path.join(
          _task_dir(self._output_dir, tasks, index), kind),
                                                           on_create=self._claim_log)
    return self._writers[kind, index]

  def _close_writers(self):
    for writer in (self._writers or {}).values():
      writer.close()
    self._writers = None
    if self._jsonl is not None:
      self._jsonl.close()

  def _train_writer(self, index):
    return self._writer('train', index)

  def _eval_writer(self, index):
    return self._writer('eval', index)

  def _log(self, message, stdout=True):
    _log.info(message)
    if stdout and self._is_chief:
      self._bar.write(message)

  def _log_step(self, message, stdout=True):
    self._log(f'Step {self._step:6d}: {message}', stdout=stdout)

  def log_summary(self, values, summary_writer, value_prefix, log_prefix,
                  stdout=True, rjust_len=None):
    """Logs scalar `{name: value}`s to stdout, history, metrics.jsonl and
    TensorBoard (other values are skipped)."""
    rjust_len = self._rjust_len if rjust_len is None else rjust_len
    for name, value in values.items():
      full_name = value_prefix + name
      if not np.shape(value):
        self._log_step(f'{log_prefix.ljust(5)} {name.rjust(rjust_len)} '
                       f'| {float(value): .8f}', stdout=stdout)
        if summary_writer is not None:
          summary_writer.scalar(full_name, value, self._step)
        if self._jsonl is not None:
          self._jsonl.write(self._step, log_prefix, full_name, value)
        # Scalars only: the history must stay JSON (it goes in checkpoints).
        self._history.append(log_prefix, full_name, self._step, value)
    if summary_writer is not None:
      summary_writer.flush()
    if self._jsonl is not None:
      self._jsonl.flush()

  # --- checkpoints -------------------------------------------------------------

  def _checkpoint_trees(self):
    states = self._task_states
    return {
        'weights': self._weights,
        'state': self._state,
        'eval_state': self._eval_state,
        'loss_weights': tuple(t.loss_weights for t in states),
        'loss_state': tuple(t.loss_state for t in states),
        'slots': tuple(t.slots for t in states),
        'opt_params': tuple(t.opt_params for t in states),
        'rng': self._rng,
        'input_signature': self._input_signature,
    }

  def save_checkpoint(self, basename=None, permanent=False):
    """Saves the complete training state as a native checkpoint directory.

    Unless the loop was built with `write_trax_files=False`, Trax's files are
    written beside it (see `export_trax_checkpoint`): `model.pkl.gz` for a
    rolling checkpoint, `model_<step>.pkl.gz` for a permanent one and
    `<basename>.pkl.gz` for a named one, as Trax's `Loop` names them.

    Args:
      basename: a name under `output_dir` (Trax's argument, e.g. 'model' or
        'lowest_loss'; an existing one is replaced atomically). None saves a
        rolling checkpoint `ckpt_<step>` and keeps the newest
        `keep_checkpoints` of those.
      permanent: with `basename=None`, save the never-deleted `model_<step>`.

    Returns:
      The checkpoint's path, or None when there is no `output_dir` or this
      host is not the chief.
    """
    self._check_pending()  # Never save weights after a NaN loss.
    if self._output_dir is None or not self._is_chief:
      return None
    if basename is not None:
      path = os.path.join(self._output_dir, basename)
    elif permanent:
      path = checkpointing.permanent_path(self._output_dir, self._step)
    else:
      path = checkpointing.rolling_path(self._output_dir, self._step)
    batches = {'train': [t.n_batches for t in self._tasks],
               'eval': [t.n_batches for t in self._eval_tasks]}
    trees = checkpointing.to_host(self._checkpoint_trees())  # One transfer.
    checkpointing.check_finite(trees, self._step, self._last_saved_step)
    checkpointing.save_training_checkpoint(
        path, trees, self._step, self._history.to_dict()['_values'], batches,
        self._checkpoint_kind, accumulator=self._acc.to_dict())
    if basename is None and not permanent:
      checkpointing.rotate(self._output_dir, self._keep_checkpoints,
                           report=self._log)
      self._last_rolling_step = self._step
    if self._write_trax_files:  # Trax's names: model, model_<step>, <basename>.
      self._save_trax_files(self._trax_basename(basename, permanent), trees)
    self._last_saved_step = self._step
    self._log_step(f'Saved checkpoint {path}', stdout=False)
    return path

  def _trax_basename(self, basename=None, permanent=False):
    if basename is not None:
      return basename
    if permanent:
      return f'{checkpointing.TRAX_BASENAME}_{self._step}'
    return checkpointing.TRAX_BASENAME

  def _repair_trax_files(self):
    """After resuming at `step` in `output_dir`: rewrites Trax's files of the
    step's native checkpoints (`model` for `ckpt_<step>`, `model_<step>` for
    `model_<step>`) where a kill came between the native save and theirs."""
    names = [self._trax_basename(permanent=permanent)
             for permanent, native_path in (
                 (False, checkpointing.rolling_path(self._output_dir,
                                                    self._step)),
                 (True, checkpointing.permanent_path(self._output_dir,
                                                     self._step)))
             if ckpt_lib.is_native_checkpoint(native_path)]
    stale = [n for n in names if checkpointing.trax_file_step(
        os.path.join(self._output_dir, n + '.pkl.gz')) != self._step]
    trees = checkpointing.to_host(self._checkpoint_trees()) if stale else None
    for name in stale:
      self._save_trax_files(name, trees)
      self._log_step(f'Rewrote Trax files {name}.* of the resumed step '
                     '(their save had been interrupted)', stdout=False)

  def load_checkpoint(self, directory=None, filename=None):
    """Restores the training state from a checkpoint.

    Args:
      directory: where to look (default `output_dir`).
      filename: a checkpoint name in `directory` (a native checkpoint
        directory, or a Trax `<name>.pkl.gz`). None takes the newest native
        checkpoint whose checksums verify (a damaged newer one is reported and
        skipped), else Trax's `model.pkl.gz` if present.
        Checkpoints are ordered by the step recorded inside them.

    Returns:
      The path loaded, or None if there was nothing to load.

    Raises:
      CheckpointError: the named checkpoint is damaged; with `filename=None`,
        checkpoints exist but none is usable (each is named in the message).
      CheckpointNotFoundError (a FileNotFoundError): the named checkpoint
        does not exist.
    """
    directory = directory or self._output_dir
    if directory is None:
      return None
    directory = os.path.expanduser(
        local_paths.check_local(os.fspath(directory), 'load_checkpoint'))
    if filename is None:
      found = checkpointing.find_resume_checkpoint(directory, report=self._log)
      if found is None:
        return None
      kind, path = found
      return self._load_trax(path) if kind == 'trax' else self._load_native(
          path)
    path = os.path.join(directory, filename)
    if not ckpt_lib.is_native_checkpoint(path):
      trax_path = checkpointing.trax_checkpoint_path(directory, filename)
      if trax_path is None:
        raise ckpt_lib.CheckpointNotFoundError(
            f'No checkpoint named {filename!r} in {directory} (neither a '
            'native checkpoint directory nor a Trax .pkl.gz file).')
      return self._load_trax(trax_path)
    return self._load_native(path)

  def _load_native(self, path):
    trees, meta = checkpointing.load_training_checkpoint(path)
    restore = checkpointing.restore_like
    states = self._task_states
    if len(trees['slots']) != len(states):
      raise ckpt_lib.TreeStructureError(
          f'{path} holds {len(trees["slots"])} training task(s); this loop has '
          f'{len(states)}.')
    replicate = self._parallel.replicate
    self._weights = replicate(restore(trees['weights'], self._weights,
                                      'weights'))
    self._state = replicate(restore(trees['state'], self._state, 'state'))
    self._eval_state = replicate(restore(trees['eval_state'], self._eval_state,
                                         'eval_state'))
    for i, t in enumerate(states):
      t.loss_weights = replicate(restore(trees['loss_weights'][i],
                                         t.loss_weights, 'loss_weights'))
      t.loss_state = replicate(restore(trees['loss_state'][i], t.loss_state,
                                       'loss_state'))
      t.slots = replicate(restore(trees['slots'][i], t.slots, 'slots'))
      t.opt_params = replicate(restore(trees['opt_params'][i], t.opt_params,
                                       'opt_params'))
    self._rng = jnp.asarray(trees['rng'])
    if (self._run_files is not None and not self._run_files.existed and
        os.path.dirname(os.path.abspath(path)) == os.path.abspath(
            self._output_dir) and os.path.exists(self._jsonl.path)):
      # A run of a retrax that kept no run_files.json: its checkpoint and
      # metrics.jsonl were written together.
      self._claim_log(self._jsonl.path)
    self._restore_position(int(meta['step']), trax_history.History.from_dict(
        meta['history']), meta.get('batches', {}), meta.get('accumulator'))
    if (self._write_trax_files and self._is_chief and
        self._output_dir is not None and os.path.dirname(os.path.abspath(
            path)) == os.path.abspath(self._output_dir)):
      self._repair_trax_files()
    self._log_step(f'Resumed from checkpoint {path}')
    return path

  def _load_trax(self, path):
    """Loads weights, state, slots, step and history from a Trax checkpoint."""
    d = checkpointing.read_trax_checkpoint(path)
    self._weights = self._parallel.replicate(ckpt_lib.unflatten_like(
        d['flat_weights'], self._weights, what='weights'))
    if d['flat_state'] is not None:
      self._state = self._parallel.replicate(ckpt_lib.unflatten_like(
          d['flat_state'], self._state, what='state'))
    if d['flat_eval_state'] is not None:
      self._eval_state = self._parallel.replicate(ckpt_lib.unflatten_like(
          d['flat_eval_state'], self._eval_state, what='eval_state'))
    if d['slots'] and len(d['slots']) != len(self._task_states):
      raise ckpt_lib.TreeStructureError(
          f'{path} holds optimizer slots for {len(d["slots"])} training '
          f'task(s); this loop has {len(self._task_states)} (is a '
          '.opt_slots<i>.npy.gz file missing?).')
    for t, flat in zip(self._task_states, d['slots']):
      leaves = ckpt_lib.tree_leaves(t.slots)
      present = [i for i, x in enumerate(leaves) if x is not None]
      if len(present) != len(flat):
        raise ckpt_lib.TreeStructureError(
            f'{path}: {len(flat)} optimizer slot arrays for an optimizer with '
            f'{len(present)}; was it written with another optimizer?')
      for i, x in zip(present, flat):
        leaves[i] = x
      t.slots = self._parallel.replicate(ckpt_lib.unflatten_like(
          leaves, t.slots, what='slots'))
    history = trax_history.History.from_dict(d['history'])
    self._restore_position(int(d['step'] or 0), history, {})
    self._log_step(f'Loaded Trax checkpoint {path} (weights, state, slots and '
                   'history; data streams and random keys start afresh)')
    return path

  def _restore_position(self, step, history, batches, accumulator=None):
    """Sets step and history, skips consumed batches, cuts logs back to `step`."""
    self._step = step
    self._history = history
    self._pending.clear()
    self._acc.reset(None)
    if accumulator is not None:
      self._acc.load(accumulator)
    self._last_saved_step = step
    self._last_rolling_step = step
    for kind, tasks in (('train', self._tasks), ('eval', self._eval_tasks)):
      for i, (task, n) in enumerate(zip(tasks, batches.get(kind, []))):
        if n >= task.n_batches:
          task.skip(n - task.n_batches)  # Re-read the stream up to there.
        else:
          self._log(f'Note: {kind} stream {i} has delivered {task.n_batches} '
                    f'batches, more than the {n} of the checkpoint; it goes on '
                    'from where it is (a resumed run sees other data).')
    self._truncate_logs(step)
    self._sync_model()

  def _truncate_logs(self, step):
    """Cuts the run's own metrics.jsonl and event files back to `step` (a
    killed run's later records, and any record torn by the kill, go)."""
    if self._run_files is None:
      return
    metrics = self._jsonl.path
    if os.path.exists(metrics) and not self._run_files.owns(
        metrics_log.METRICS_FILE):
      raise FileExistsError(
          f'{metrics} was not written by a retrax run in this directory '
          f'({metrics_log.RUN_FILES} does not list it) and retrax never '
          'rewrites a log it did not write: move it or choose another '
          'output_dir.')
    for path in self._run_files.files():
      if not os.path.exists(path):
        continue
      if path == metrics:
        self._jsonl.truncate(step)
      elif os.path.basename(path).startswith('events.out.tfevents.'):
        metrics_log.truncate_event_file(path, step)

  def export_trax_checkpoint(self, basename='model'):
    """Writes Trax's `Loop` checkpoint files (`<basename>.pkl.gz` ...).

    Trax 1.4 and `Layer.init_from_file` read them; they hold weights, state,
    optimizer slots, step and history (not the data position or PRNG key).

    Returns:
      The `.pkl.gz` path, or None without `output_dir` / on non-chief hosts.
    """
    self._check_pending()
    if self._output_dir is None or not self._is_chief:
      return None
    trees = checkpointing.to_host(self._checkpoint_trees())
    checkpointing.check_finite(trees, self._step, self._last_saved_step)
    return self._save_trax_files(basename, trees)

  def _save_trax_files(self, basename, trees):
    """Writes Trax's files from `_checkpoint_trees()` already on the host."""
    leaves = ckpt_lib.tree_leaves
    return checkpointing.write_trax_checkpoint(
        os.path.join(self._output_dir, basename), self._step,
        leaves(trees['weights']), leaves(trees['state']),
        leaves(trees['eval_state']), self._history.to_dict(),
        [[s for s in leaves(slots) if s is not None]
         for slots in trees['slots']],
        self._input_signature)

