"""torchrun, except that a rank's preemption exit is the launcher's exit too.

A process that stops for a preemption exits 75 (`trainer.config.PREEMPTED_EXIT_CODE`, the
bundled trainer's contract and the one documented for users' jobs), but torchrun turns any
failed worker into its own exit code 1, and sortie would take a preemption for a failure.
This runs torchrun's own `main` and, when a worker failed, exits 75 if any worker exited 75.

Run it by path, ``python .../trainer/torchrun.py [torchrun args] script [args]``
($SORTIE_TORCHRUN on a node): it imports nothing but torch, so that a user's job never sees
the bundled trainer on its import path.
"""

from __future__ import annotations

import sys

PREEMPTED_EXIT_CODE = 75  # as trainer.config's; not imported: see the module's docstring


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as failed:
        print(failed, file=sys.stderr)  # torchrun's own table: which rank, which exit code
        codes = {failure.exitcode for failure in failed.failures.values()}
        return PREEMPTED_EXIT_CODE if PREEMPTED_EXIT_CODE in codes else 1
    return 0


if __name__ == "__main__":
    # Run by path, this file's directory (the trainer's modules) heads the import path: drop it.
    sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
