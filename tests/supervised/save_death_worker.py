"""`python save_death_worker.py ARGS...`: `retrax ARGS...` whose process 1
dies inside its second sharded save (before its shards are written, while
process 0 joins the save's collectives), as a preempted host does."""

import os
import sys

from retrax import checkpoints
from retrax.app import cli

_save = checkpoints.save_native_sharded
_saves = []


def _dying_save(*args, process_index, **kwargs):
  _saves.append(1)
  if process_index == 1 and len(_saves) == 2:
    os._exit(9)  # pylint: disable=protected-access
  return _save(*args, process_index=process_index, **kwargs)


if __name__ == '__main__':
  checkpoints.save_native_sharded = _dying_save
  sys.exit(cli.main(sys.argv[1:]))
