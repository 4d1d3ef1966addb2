from .cli import main
from .launch import exit_now

exit_now(main() or 0)  # the exit handlers run; the interpreter's teardown of what a command imported is skipped
