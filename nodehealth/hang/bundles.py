"""Hang bundles on disk: in our own directory only, each capped, the oldest rotated out.

The bundle directory lies where users of the node can write the directory above it (beside the
records), and the detector runs as root: it is made by us, opened without following a link and
refused unless we own it and nobody else may write in it. A bundle over its cap loses its bulkiest
evidence first, and says so; the directory is kept under its byte and count limits.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
from typing import Any

log = logging.getLogger(__name__)


class BundleError(Exception):
    pass


class BundleDir:
    def __init__(self, path: str, max_bytes: int, max_dir_bytes: int, max_count: int):
        self.path = path
        self.max_bytes = max_bytes
        self.max_dir_bytes = max_dir_bytes
        self.max_count = max_count

    def write(self, name: str, bundle: dict[str, Any]) -> str:
        """Write a bundle (size-capped) as `name` and rotate the oldest out; its path, or BundleError."""
        data = capped(bundle, self.max_bytes)
        try:
            dir_fd = self._open()
        except OSError as e:
            raise BundleError(f"cannot write hang bundle into {self.path}: {e.strerror or e}") from None
        try:
            tmp = f".tmp-{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640,
                         dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            self._rotate(dir_fd, name)
            return os.path.join(self.path, name)
        except OSError as e:
            raise BundleError(f"cannot write hang bundle {name}: {e.strerror or e}") from None
        finally:
            os.close(dir_fd)

    def _open(self) -> int:
        """The directory, made if missing, opened without following a link, refused unless ours alone."""
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path, 0o750)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OSError(e.errno, "a link or not a directory; refused", self.path) from None
            raise
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid} or writable by others; refused", self.path)
        return fd

    def _rotate(self, dir_fd: int, keep: str) -> None:
        """Remove the oldest bundles while there are too many or they take too much room."""
        bundles = []
        for name in os.listdir(dir_fd):
            if name.startswith("hang-") and name.endswith(".json"):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    bundles.append((st.st_mtime, name, st.st_size))
        bundles.sort()
        total = sum(b[2] for b in bundles)
        count = len(bundles)
        for _, name, size in bundles:
            if total <= self.max_dir_bytes and count <= self.max_count:
                break
            if name == keep:
                continue
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
                total, count = total - size, count - 1
                log.info("hang: removed old bundle %s (the bundle directory is full)", name)


def capped(bundle: dict[str, Any], limit: int) -> bytes:
    """The bundle as JSON within `limit` bytes: the bulkiest evidence goes first, and the bundle says so."""
    data = json.dumps(bundle, separators=(",", ":"), sort_keys=True).encode()
    for key in ("native_stacks", "flight_recorder", "stacks", "records"):
        if len(data) <= limit:
            break
        if bundle.get(key):
            bundle = {**bundle, key: {}, "errors": bundle.get("errors", []) + [
                f"{key} left out: the bundle was over its cap of {limit} bytes"]}
            data = json.dumps(bundle, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > limit:  # still too big: the verdict and the reasons only
        small = {k: bundle[k] for k in ("version", "kind", "node", "job", "detected_at", "owner", "reasons",
                                        "processes", "pods", "exit_statuses", "verdicts") if k in bundle}
        small["errors"] = [f"the bundle was over its cap of {limit} bytes: only the verdict is kept"]
        data = json.dumps(small, separators=(",", ":"), sort_keys=True).encode()
    return data
