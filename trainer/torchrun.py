"""torchrun, except that a rank's preemption exit is the launcher's exit too, the static
rendezvous store listens only on the address the nodes use, and the store's host leaves the exit
barrier last (`leave_after_every_agent`).

A process that stops for a preemption exits 75 (`trainer.config.PREEMPTED_EXIT_CODE`, the
bundled trainer's contract and the one documented for users' jobs), but torchrun turns any
failed worker into its own exit code 1, and sortie would take a preemption for a failure.
This runs torchrun's own `main` and, when a worker failed, exits 75 if any worker exited 75.

Run it by path, ``python .../trainer/torchrun.py [torchrun args] script [args]``
($SORTIE_TORCHRUN on a node): it imports nothing but torch, so that a user's job never sees
the bundled trainer on its import path.

torchrun's store (a TCPStore server on node rank 0) listens on every interface of the machine:
with the static rendezvous (`--rdzv-backend=static --node-rank=0 --rdzv-endpoint=ADDR:PORT`)
this binds the listening socket to ADDR itself and hands it to the store
(``master_listen_fd``), so that nothing but the cluster's own network reaches it.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any

PREEMPTED_EXIT_CODE = 75  # as trainer.config's; not imported: see the module's docstring
# Said when the job's Python has no torch (an image without it, a site's Python): before, the
# job's log held a traceback in this file, which read as sortie's own failure.
NO_TORCH = "[sortie] no torch for torchrun: "
# Said when the rendezvous port is taken on the store's host: chosen free, it was taken before
# the job started (a program beside the job, another job's store), and the job's log held a
# traceback in this file.
PORT_TAKEN = "[sortie] the rendezvous port is taken on this node: "


def _option(argv: list[str], name: str) -> str | None:
    """A torchrun option's value (``--name=V``, ``--name V``, with ``-`` or ``_``), before the
    script; None where it is not given."""
    names = {f"--{name}", f"--{name.replace('-', '_')}"}
    for index, arg in enumerate(argv):
        if not arg.startswith("-"):
            return None  # the script: what follows is its own
        key, _, value = arg.partition("=")
        if key in names:
            return value if value or "=" in arg else next(iter(argv[index + 1:index + 2]), None)
    return None


def bind_static_store(argv: list[str]) -> socket.socket | None:
    """On the static rendezvous's host (node rank 0), a socket bound to the endpoint's own
    address, passed on to the TCPStore torchrun creates; None elsewhere."""
    endpoint = _option(argv, "rdzv-endpoint")
    if _option(argv, "rdzv-backend") != "static" or _option(argv, "node-rank") != "0" or \
            not endpoint or ":" not in endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        return None
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, int(port)))
        listener.listen(1024)
    except OSError as exc:
        listener.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        print(f"{PORT_TAKEN}{endpoint} (another program listens there)", file=sys.stderr,
              flush=True)
        raise SystemExit(1) from None

    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    store_class = static_tcp_rendezvous.TCPStore

    def store_on_the_bound_socket(*args: Any, **kwargs: Any) -> Any:
        is_master = args[3] if len(args) > 3 else kwargs.get("is_master", False)
        if is_master:
            kwargs["master_listen_fd"] = listener.fileno()
        return store_class(*args, **kwargs)

    static_tcp_rendezvous.TCPStore = store_on_the_bound_socket  # type: ignore[misc, assignment]
    return listener


DEPARTED_KEY = "sortie/departed"
DEPART_WAIT_S = 10.0  # after a barrier all passed, the others leave within milliseconds


def leave_after_every_agent(hosting: bool | None = None) -> None:
    """Make torchrun's exit barrier let the store's host leave last.

    torch's barrier (`elastic/utils/store.barrier`) releases every agent once the last one
    *sets* its key; the host of the store (node rank 0's agent) may then exit, closing the
    store, while that last agent's own `wait` is still in flight: it logs "Error waiting on exit
    barrier ... Connection was likely closed" with a traceback, after a job that succeeded
    (3 of the first 7 runs of a user's DDP script under load, `benchmarks/own_job.py`). After
    the barrier, each agent counts itself out; the host (``hosting``: the static rendezvous's
    node rank 0) then waits until all have (at most DEPART_WAIT_S), and the others leave at
    once: no agent is mid-request when the host goes. Had the others waited too, one still
    asking for the count as the host left logged the store's C++ "recvValue failed ...
    Connection was likely closed" after a job that succeeded (4 of 12 runs of a user's 2 x 2
    script). Where who hosts is not known (``None``: another rendezvous), every agent waits.
    Errors here are the store going away at the very end, and change nothing."""
    import time

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    barrier = SimpleElasticAgent._exit_barrier

    def exit_barrier_then_depart(self: SimpleElasticAgent) -> None:
        barrier(self)
        try:
            agents, deadline = self._worker_group.group_world_size, time.monotonic() + DEPART_WAIT_S
            store = self._store
            left = store.add(DEPARTED_KEY, 1) if store is not None else agents
            while store is not None and hosting is not False and left < agents and \
                    time.monotonic() < deadline:
                time.sleep(0.005)
                left = store.add(DEPARTED_KEY, 0)
        except Exception:  # noqa: BLE001, S110 - the store's host is gone: all have left
            pass

    SimpleElasticAgent._exit_barrier = exit_barrier_then_depart  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun
    except ImportError as missing:
        print(f"{NO_TORCH}{sys.executable} cannot import torch ({missing}): a job's torchrun "
              "runs with the node's Python ($SORTIE_PYTHON; in an image, the image's python3); "
              "install torch there", file=sys.stderr, flush=True)
        return 1

    listener = bind_static_store(argv)  # noqa: F841  (kept open until torchrun ends)
    static = _option(argv, "rdzv-backend") == "static"  # its store: node rank 0's agent
    leave_after_every_agent(hosting=_option(argv, "node-rank") == "0" if static else None)
    try:
        torchrun(argv)
    except ChildFailedError as failed:
        # One line where torchrun prints a table of its own (each rank and its exit code is
        # all it holds: the ranks' own tracebacks are in the log above it). A preemption is
        # expected and relaunched by sortie; the ranks beside a preempted one often fail as
        # their peer goes, and that is the preemption too.
        exits = {rank: failure.exitcode for rank, failure in sorted(failed.failures.items())}
        preempted = [rank for rank, code in exits.items() if code == PREEMPTED_EXIT_CODE]
        others = ", ".join(f"rank {rank} (exit {code})" for rank, code in exits.items()
                           if code != PREEMPTED_EXIT_CODE)
        if preempted:
            print(f"[sortie] rank {', '.join(map(str, preempted))} stopped for a preemption "
                  f"(exit {PREEMPTED_EXIT_CODE})" + (f"; {others} ended with it" if others
                                                      else ""), file=sys.stderr, flush=True)
            return PREEMPTED_EXIT_CODE
        print(f"[sortie] torchrun: {others} failed", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    # Run by path, this file's directory (the trainer's modules) heads the import path: drop it.
    sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
