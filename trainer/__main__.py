import os
import sys

from .train import main

code = main()
# Leave without interpreter finalization: gloo's C++ threads can still hold Python objects then,
# and tearing those down aborts the process (pytorch#179291). Everything is written and closed.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
