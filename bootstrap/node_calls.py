"""One step on every node at once, and the error that names the node it failed on: apart from
SSH (`ssh.py`), so that what only names a node's failure (`container.py`, and through it a
backend that `status` lists) loads no SSH library."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sortie.core.errors import SortieError
from sortie.core.inventory import Node

T = TypeVar("T")


class NodeError(SortieError):
    """A step failed on one node; the message names the node."""


def _named(node: Node, exc: Exception) -> NodeError:
    """A library's error as ``node``'s: a command's timeout in words (its own text quotes the
    command and output), anything else by its type."""
    from invoke.exceptions import CommandTimedOut  # (loaded already by the step's transport)

    if isinstance(exc, CommandTimedOut):
        return NodeError(f"{node.name}: no answer within {exc.timeout:.0f}s")
    return NodeError(f"{node.name}: {type(exc).__name__}: {exc}")


def on_all(nodes: Sequence[Node], step: Callable[[Node], T]) -> list[T]:
    """Run ``step`` on every node in parallel; results in node order.

    If any node fails, the first failure in node order is raised, naming its node. On Ctrl-C
    nodes still busy are left to teardown, which ends their connections."""
    pool = ThreadPoolExecutor(max_workers=max(1, len(nodes)), thread_name_prefix="sortie-node")
    futures = [pool.submit(step, node) for node in nodes]
    errors: list[BaseException] = []
    results: list[T] = []
    try:
        for node, future in zip(nodes, futures, strict=True):
            try:
                results.append(future.result())
            except SortieError as exc:
                errors.append(exc)
            except Exception as exc:  # a library error: say which node it came from
                errors.append(_named(node, exc))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if errors:
        raise errors[0]
    return results
