"""walqueue-ctl whose backup stops after its first file: ``python -m tests.process.interrupted_ctl
CTL_ARGS...``.

The real command line and the real copy, except that once the first file of
the manifest is in DEST it prints "copied FILE" and waits forever, so a test
can send SIGINT (or SIGKILL) to a backup that is half way, by pid.
"""

import os
import sys
import threading

from walqueue import backup, ctl

real_copy = backup._copy_file


def copy_then_stall(source, target, length, source_path):
    real_copy(source, target, length, source_path)
    print("copied", os.path.basename(target), flush=True)
    threading.Event().wait()  # a Ctrl-C raises KeyboardInterrupt here, as in a slow copy


if __name__ == "__main__":
    backup._copy_file = copy_then_stall
    sys.argv[0] = "walqueue-ctl"
    ctl.main()
