"""The entry of a variant's child process: `python -m dsnb.child child.json` (launch.run_variant starts it)."""
import sys

from .launch import child_main, exit_now

exit_now(child_main(sys.argv[1]))  # everything the run records is in the store and its files by now
