"""A run command for tests: prints a score, or with "kill" kills the worker process that started it."""

import os
import signal
import sys
import time

mode = sys.argv[1]
if mode == "kill":
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(5)
elif mode.startswith("sleep"):
    time.sleep(float(mode[5:]))
print(f'{{"score": {len(mode)}}}')
