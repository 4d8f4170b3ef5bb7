import sys

# kio registers hypothesis strategies for its types whenever hypothesis can be
# imported (a test environment has it): a quarter of a second of every broker's
# and gateway's start, which the tests pay hundreds of times, for nothing a
# server uses. `python -m shoal` is how the tests start servers; nothing that
# runs in-process (the CLI's tests, hypothesis's own) comes through here.
sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

from shoal.cli.app import main  # noqa: E402

main()
