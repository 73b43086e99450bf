"""walqueue-ctl with its backup copy stalled: ``python -m tests.process.stalled_ctl CTL_ARGS...``.

The real command line, except that copying a manifest prints "copying" and
then waits forever (until the test kills this process by pid), so a test
can act while a backup holds the daemon's pin.
"""

import sys
import threading

from walqueue import ctl
from walqueue.ctl import admin


def stalled_copy(manifest, dest):
    print("copying", manifest.seq, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    admin.copy_manifest = stalled_copy
    sys.argv[0] = "walqueue-ctl"
    ctl.main()
