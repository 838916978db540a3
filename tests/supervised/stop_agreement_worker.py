"""`python stop_agreement_worker.py ADDRESS PROCESS_ID`: joins a 2-process
run and agrees on stops (`peers.agree_on_stop`) as `Loop.run` does before
each step: process 1 signals at the second agreement and dies before the
third; process 0 prints what each agreement gave, then the error of the
one its dead peer never reaches."""

import os
import signal
import sys
import time

from retrax.supervised import peers


def main(address, process_id):
  peers.PEER_SILENT_SECONDS = 5  # Seconds, for the test.
  peers.join(address, 2, process_id)
  for n in range(3):
    if process_id == 1 and n == 2:
      os._exit(9)  # pylint: disable=protected-access
    mine = signal.SIGTERM if (process_id, n) == (1, 1) else 0
    start = time.time()
    try:
      agreed = peers.agree_on_stop(mine)
    except peers.PeerLostError as e:
      print(f'lost after {time.time() - start:.1f} s: {e}', flush=True)
      os._exit(2)  # pylint: disable=protected-access
    print(f'agreement {n}: {agreed}', flush=True)


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]))
