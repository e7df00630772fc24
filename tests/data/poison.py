"""A run command for tests: prints a score, or with "kill" kills the worker process that started it ("killonce"
does so only when the file named by its second argument is not there yet, and creates it)."""

import os
import signal
import sys
import time

mode = sys.argv[1]
if mode == "kill" or (mode == "killonce" and not os.path.exists(sys.argv[2])):
    if mode == "killonce":
        open(sys.argv[2], "w").close()
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(5)
elif mode.startswith("sleep"):
    time.sleep(float(mode[5:]))
print(f'{{"score": {len(mode)}}}')
