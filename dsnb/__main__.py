import atexit
import os
import sys

from .cli import main

code = main()
# As dsnb.child does: the exit handlers run and the streams are flushed, the interpreter's teardown of what was
# imported (MLflow, pandas, and for some commands torch) is skipped: up to 2-3 s of every command on 2 CPU cores.
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code or 0)
