"""Floods stdout and stderr, then crashes the process it runs in, as a kernel
with a wild pointer would."""

import os
import signal
import sys


def program(shape, dtype, target):
    for _ in range(2000):
        print("x" * 100)
        print("y" * 100, file=sys.stderr)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
