"""The entry of a variant's child process: `python -m dsnb.child child.json` (launch.run_variant starts it)."""
import sys

from .launch import child_main

sys.exit(child_main(sys.argv[1]))
