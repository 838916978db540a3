"""A `Loop`'s output directory: its log files, and cutting them back on resume.

`RunDir(output_dir, is_chief)` owns what a run writes beside its checkpoints
and, on the chief, the directory's lock (`ownership.RunLock`: one writer at a
time):
`run_files.json` (the log files runs there created, claimed before they are
created), `metrics.jsonl` and the TensorBoard writers (`<dir>/train`,
`<dir>/eval`, per task under `<dir>/<export_prefix or index>` when there are
several). Only those files are ever cut back (to a restored step) or have
orphan temporary files removed, and only inside the directory (symlinks
resolved, `ownership.check_inside`); on hosts other than the chief nothing is
written. Every scalar recorded also goes to the run's reporters
(`reporters`: W&B, MLflow), which `close_reporters` ends.
"""

import os
from typing import Optional

from retrax import local_paths
from retrax import run_layout
from retrax.checkpoints import ownership
from retrax.supervised import checkpointing
from retrax.supervised import metrics_log


class RunDir:
  """The output directory of one loop (`path` None: nothing is written)."""

  def __init__(self, output_dir, is_chief):
    self.path = None if output_dir is None else os.path.expanduser(
        local_paths.check_local(os.fspath(output_dir), 'Loop: output_dir'))
    self.reporters: list = []  # The Loop's (on the chief).
    self.jsonl: Optional[metrics_log.JsonlWriter] = None
    self._writers: Optional[dict] = None
    self._run_files: Optional[metrics_log.RunFiles] = None
    self._lock: Optional[ownership.RunLock] = None
    if self.path is None:
      return
    os.makedirs(self.path, exist_ok=True)
    if is_chief:
      self._lock = ownership.RunLock(self.path)
      self._run_files = metrics_log.RunFiles(self.path)
      self.jsonl = metrics_log.JsonlWriter(
          os.path.join(self.path, run_layout.METRICS_FILE),
          on_create=self._claim)

  @property
  def writes(self):
    """True if this host writes the run's files (an output dir, the chief).

    Raises:
      RunDirInUseError: a newer Loop of this process took the directory over.
    """
    if self._lock is not None:
      self._lock.check()
    return self._run_files is not None

  def checkpoint_note(self, last_saved_step):
    """Which checkpoint is the run's last, for error messages: this loop's
    `last_saved_step`, else (a process that writes nothing, not the chief)
    the chief's newest valid one in the directory."""
    if last_saved_step is not None:
      return f'the last checkpoint is from step {last_saved_step}'
    if self.path is not None and not self.writes:
      path = checkpointing.find_latest_valid(self.path)
      if path is not None:
        return f'the last checkpoint is {path}'
    return 'no checkpoint was saved'

  def _own_files(self) -> tuple[str, metrics_log.RunFiles,
                                metrics_log.JsonlWriter]:
    """`(path, run files, metrics.jsonl)` of a directory this host writes
    (called only where `writes` holds, or by writers only that host has)."""
    if self.path is None or self._run_files is None or self.jsonl is None:
      raise RuntimeError('RunDir: this host writes no files in the run '
                         'directory (no output_dir, or not the chief).')
    return self.path, self._run_files, self.jsonl

  def _claim(self, path):
    root, run_files, _ = self._own_files()
    ownership.check_inside(root, path)  # A log file behind a symlink.
    run_files.claim(os.path.relpath(path, root))

  def remove_orphans(self):
    """Removes temporary files that killed writes left (chief only)."""
    if self.writes:
      root, run_files, _ = self._own_files()
      checkpointing.remove_orphans(root, run_files.files())

  def holds(self, path):
    """True if `path` (a checkpoint) lies directly in this directory."""
    return self.path is not None and os.path.dirname(
        os.path.abspath(path)) == os.path.abspath(self.path)

  def adopt_legacy_metrics(self, checkpoint_path):
    """Claims the metrics.jsonl of a retrax that kept no run_files.json,
    resumed from `checkpoint_path` here (they were written together)."""
    if not self.writes:
      return
    _, run_files, jsonl = self._own_files()
    if (not run_files.existed and self.holds(checkpoint_path) and
        os.path.exists(jsonl.path)):
      self._claim(jsonl.path)

  def open_writers(self):
    """Enables the TensorBoard writers, each created when first used."""
    self._writers = {} if self.writes else None

  def writer(self, kind, index, tasks):
    """The event writer of `kind` ('train'/'eval') task `index` of `tasks`."""
    if self._writers is None:
      return None
    if (kind, index) not in self._writers:
      root, _, _ = self._own_files()  # Writers are open only where it writes.
      task_dir = root
      if len(tasks) > 1:
        task_dir = os.path.join(root, tasks[index].export_prefix or str(index))
      log_dir = ownership.check_inside(root, os.path.join(task_dir, kind))
      self._writers[kind, index] = metrics_log.EventWriter(
          log_dir, on_create=self._claim)
    return self._writers[kind, index]

  def record(self, writer, step, mode, name, value):
    """Writes a scalar to `writer` (if not None), metrics.jsonl and the
    reporters."""
    if writer is not None:
      writer.scalar(name, value, step)
    if self.jsonl is not None:
      self.jsonl.write(step, mode, name, value)
    for reporter in self.reporters:
      reporter.record(step, mode, name, value)

  def flush(self, writer):
    if writer is not None:
      writer.flush()
    if self.jsonl is not None:
      self.jsonl.flush()
    for reporter in self.reporters:
      reporter.flush()

  def close_writers(self):
    for writer in (self._writers or {}).values():
      writer.close()
    self._writers = None
    if self.jsonl is not None:
      self.jsonl.close()
    for reporter in self.reporters:  # Their runs stay open for the next run.
      reporter.flush()

  def close_reporters(self):
    """Ends the reporters' runs (W&B, MLflow)."""
    reporters, self.reporters = self.reporters, []
    for reporter in reporters:
      reporter.close()

  def truncate(self, step):
    """Cuts the run's own metrics.jsonl and event files back to `step` (a
    killed run's later records, and any record torn by the kill, go)."""
    if not self.writes:
      return
    root, run_files, jsonl = self._own_files()
    metrics = jsonl.path
    if os.path.exists(metrics) and not run_files.owns(
        run_layout.METRICS_FILE):
      raise FileExistsError(
          f'{metrics} was not written by a retrax run in this directory '
          f'({run_layout.RUN_FILES} does not list it) and retrax never '
          'rewrites a log it did not write: move it or choose another '
          'output_dir.')
    for path in run_files.files():
      if not os.path.exists(path):
        continue
      ownership.check_inside(root, path, 'truncate')
      if path == metrics:
        jsonl.truncate(step)
      elif os.path.basename(path).startswith(run_layout.EVENTS_PREFIX):
        metrics_log.truncate_event_file(path, step)
