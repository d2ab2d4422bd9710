"""Files kept beside Pulumi's state, where every controller using that state backend sees them:
``<backend>/.sortie/``, through fsspec (a directory for a file:// backend; s3:// gs:// az://
need s3fs, gcsfs, adlfs). Sortie's records (`stacks/records.py`), the cost ledger and the
owners' budgets (`sortie/cost/`) are kept there. What is read back is untrusted: a regular file
(an object), capped."""

from __future__ import annotations

from pathlib import Path

from sortie.core import statefile


class SharedStore:
    """``<backend_url>/.sortie/``: ``root``, and the file system (``fs``) that reaches it."""

    def __init__(self, backend_url: str) -> None:
        import fsspec

        url = backend_url.replace("azblob://", "az://", 1)  # Pulumi's scheme, adlfs's scheme
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = f"{root.rstrip('/')}/.sortie"
        self.local = "file" in self.fs.protocol or "local" in self.fs.protocol

    def read(self, path: str, max_bytes: int = statefile.MAX_STATE_BYTES) -> bytes:
        """A file of the backend, at most ``max_bytes``: a regular file (an object), checked
        before it is opened (a FIFO in a shared file:// backend would hang the command, a
        directory named like a record would raise), never read past the cap.
        FileNotFoundError when there is none, statefile.NotRegularFile otherwise."""
        if self.local:  # one open, checked: no separate look first
            return statefile.read_regular(Path(path), max_bytes)
        info = self.fs.info(path)
        if info.get("type") != "file" or info.get("islink"):
            raise statefile.NotRegularFile("not a regular file")
        if (info.get("size") or 0) > max_bytes:
            raise statefile.NotRegularFile(f"larger than {statefile.readable_cap(max_bytes)}")
        with self.fs.open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise statefile.NotRegularFile(f"larger than {statefile.readable_cap(max_bytes)}")
        return data

    def put(self, path: str, text: str) -> None:
        """Write a file whole: one PUT (object stores replace an object whole); its directory
        made first where there are directories."""
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, text.encode())
