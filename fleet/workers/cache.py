"""Each worker's cache of artifacts, by content digest, so a blob is fetched from the database once."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


class ArtifactCache:
    """Blobs on local disk, named by their SHA-256.

    Parameters
    ----------
    directory:
        Where the blobs live; private to one worker process, or shared by processes of one node (writes
        are atomic renames, and a blob's name is its content, so sharing is safe).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, digest: str) -> Path:
        return self.directory / digest[:2] / digest

    def get(self, digest: str, fetch: Callable[[str], bytes]) -> bytes:
        """The blob ``digest``, from disk, or from ``fetch`` (then kept). A corrupt file is fetched again."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == digest:
                return data
        except FileNotFoundError:
            pass
        data = fetch(digest)
        self.put(digest, data)
        return data

    def put(self, digest: str, data: bytes) -> None:
        path = self.path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
