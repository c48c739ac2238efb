import sys

from trainers.cli import main

if __name__ == "__main__":
    code = main()
    dist = sys.modules.get("trainers.runtime.dist")  # imported by every verb that can start a process group
    if dist is not None:
        dist.exit_process(code)  # a torchrun worker leaves without the interpreter's teardown (see there)
    raise SystemExit(code)
