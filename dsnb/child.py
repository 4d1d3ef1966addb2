"""The entry of a variant's child process: `python -m dsnb.child child.json` (launch.run_variant starts it)."""
import atexit
import os
import sys

from .launch import child_main

code = child_main(sys.argv[1])
# Everything the run records is in the store and its files by now. The exit handlers run (logging, MLflow, temporary
# folders) and the streams are flushed, but the interpreter's teardown of the ML stack is skipped: it took 2-3 s of
# every variant on 2 CPU cores and did nothing the run needs.
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
