import gc
import sys

from placer.cli import main

status = main()
# the process ends here: its objects are frozen so that the interpreter's last garbage collection does not walk
# torch's (and Ray's) millions of them, which took 1-3 s on 2 CPU cores after the command had finished
gc.freeze()
sys.exit(status)
