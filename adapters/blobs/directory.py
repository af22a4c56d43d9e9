"""``DirectoryBlobStore``: blobs as files under a root folder, never following a link out of it.

``<root>/job-<job id>/<name>``, written to a temporary file, fsynced and
renamed into place, so a reader sees a whole blob or none. A symbolic link
planted at a job's folder or at a blob is refused
(:class:`~pipelines.engine.errors.CorruptRecordError`), so a delete cannot
remove, nor a put write, anything outside the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.engine.blobs import check_blob_name
from pipelines.engine.errors import ConfigurationError, CorruptRecordError, StorageError
from pipelines.engine.models import validate_job_id

__all__ = ["DirectoryBlobStore"]

_DIR_PREFIX = "job-"  # never a bare path component, whatever ids a future alphabet allows
_TMP_PREFIX = ".tmp-"  # a put's file before its rename: never a blob name
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Never a link: O_NOFOLLOW refuses one at the last component, and every path is opened from the
# root's (or the job folder's) descriptor, so no component above it is looked up again.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_FD_CALLS = bool(_NOFOLLOW) and os.scandir in os.supports_fd and os.utime in os.supports_fd and all(
    f in os.supports_dir_fd for f in (os.open, os.mkdir, os.stat, os.unlink, os.rmdir, os.rename, os.utime))



class DirectoryBlobStore:
    """Blobs as files under ``root`` (created if missing), never following a link out of it.

    Every path is opened from the root's folder with ``O_NOFOLLOW``: a
    symbolic link (or anything but a plain folder or file) planted at a
    job's folder or at a blob is refused with :class:`~pipelines.engine.errors.CorruptRecordError`
    naming it, and nothing outside the root is read, written, touched or
    deleted. ``root`` itself may be a link: it is resolved once, here.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not _FD_CALLS:
            raise ConfigurationError("DirectoryBlobStore needs os functions that take dir_fd (Linux, macOS, BSD): "
                                     "without them it cannot refuse a link out of its root")
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            self.root = Path(root).resolve(strict=True)
            os.close(os.open(self.root, _DIR_FLAGS))  # a folder this process can open: said now, not at a put
        except OSError as exc:
            raise ConfigurationError(f"cannot use {str(root)!r} as a blob directory: {exc}") from exc

    def _refused(self, job_id: str, name: str, why: str = "is a symbolic link or not a plain folder or file"
                 ) -> CorruptRecordError:
        return CorruptRecordError(f"{str(self.root / name)!r} (blobs of job {job_id!r}) {why}: refused, nothing "
                                  f"outside {str(self.root)!r} is read, written or deleted; remove it by hand")

    def _open_root(self) -> int:
        try:
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CorruptRecordError(f"the blob root {str(self.root)!r} was replaced by a link or a file: "
                                         "refused, nothing read or written") from exc
            raise

    @contextlib.contextmanager
    def _folder(self, job_id: str, *, create: bool) -> Iterator[tuple[int, int | None]]:
        """``(root fd, job folder fd)``, the folder opened without following a link (``None``: there is none)."""
        name = _DIR_PREFIX + validate_job_id(job_id)
        root_fd = self._open_root()
        try:
            if create:
                with contextlib.suppress(FileExistsError):  # mkdir(2) never follows a link either
                    os.mkdir(name, dir_fd=root_fd)
            try:
                job_fd: int | None = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except FileNotFoundError:
                job_fd = None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise self._refused(job_id, name) from exc
                raise
            try:
                yield root_fd, job_fd
            finally:
                if job_fd is not None:
                    os.close(job_fd)
        finally:
            os.close(root_fd)

    def put(self, job_id: str, name: str, data: bytes) -> None:
        """Write ``data`` whole or not at all (temporary file, fsync, rename); a no-op if it is there."""
        check_blob_name(name)
        try:
            with self._folder(job_id, create=True) as (_, job_fd):
                if job_fd is None:  # removed between its mkdir and its open: the job's delete won the race
                    raise FileNotFoundError(errno.ENOENT, "the job's blob folder was deleted meanwhile")
                self._put_in(job_fd, job_id, name, data)
        except OSError as exc:
            raise StorageError(f"cannot write blob {name} of job {job_id!r}: {exc}") from exc

    def _put_in(self, job_fd: int, job_id: str, name: str, data: bytes) -> None:
        try:
            found: os.stat_result | None = os.stat(name, dir_fd=job_fd, follow_symlinks=False)
        except FileNotFoundError:
            found = None
        if found is not None:
            if not stat.S_ISREG(found.st_mode):
                raise self._refused(job_id, f"{_DIR_PREFIX}{job_id}/{name}")
            # Named by its content: the same bytes. Touch it, so the orphan sweep (by age) never takes
            # a blob that a create retried after a crash is about to reference again.
            os.utime(name, dir_fd=job_fd, follow_symlinks=False)
            os.utime(job_fd)
            return
        tmp = _TMP_PREFIX + secrets.token_hex(8)
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600, dir_fd=job_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # rename(2) replaces whatever holds the name (a link planted meanwhile too), never its target.
            os.replace(tmp, name, src_dir_fd=job_fd, dst_dir_fd=job_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=job_fd)
            raise

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        check_blob_name(name)
        where = f"{_DIR_PREFIX}{job_id}/{name}"
        try:
            with self._folder(job_id, create=False) as (_, job_fd):
                if job_fd is None:
                    return None
                try:
                    # O_NONBLOCK: a FIFO planted at the name must not hang the reader (it is refused below).
                    fd = os.open(name, _READ_FLAGS, dir_fd=job_fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise self._refused(job_id, where) from exc
                    raise
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise self._refused(job_id, where)
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read blob {name} of job {job_id!r}: {exc}") from exc

    def delete_job(self, job_id: str) -> int:
        """Remove the job's folder (left-over temporary files of a crashed put too).

        Refused with nothing deleted (:class:`~pipelines.engine.errors.CorruptRecordError`) when the
        folder is a link or holds a folder: a link inside it is removed
        itself, never what it points to.
        """
        removed = 0
        try:
            with self._folder(job_id, create=False) as (root_fd, job_fd):
                if job_fd is None:
                    return 0
                with os.scandir(job_fd) as found:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in found]
                folders = [n for n, is_dir in entries if is_dir]
                if folders:  # checked before the first unlink: refused means nothing deleted
                    raise self._refused(job_id, f"{_DIR_PREFIX}{job_id}/{folders[0]}", "is a folder, which this "
                                        "store never writes in a job's folder (nothing of the job was deleted)")
                for entry, _ in entries:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=job_fd)
                    removed += not entry.startswith(_TMP_PREFIX)
                os.rmdir(_DIR_PREFIX + job_id, dir_fd=root_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete the blobs of job {job_id!r}: {exc}") from exc
        return removed

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs with a blob folder not written to (its mtime) in the last ``older_than`` seconds.

        A link planted at a job's folder is listed too (by its own mtime), so
        the orphan sweep finds it and reports that it will not delete it.
        """
        cut = time.time() - older_than
        found: list[str] = []
        try:
            root_fd = self._open_root()
            try:
                with os.scandir(root_fd) as entries:
                    for entry in entries:
                        if entry.name.startswith(_DIR_PREFIX) and _older(entry, cut):
                            found.append(entry.name[len(_DIR_PREFIX):])
            finally:
                os.close(root_fd)
        except OSError as exc:
            raise StorageError(f"cannot list the blob folders under {str(self.root)!r}: {exc}") from exc
        return iter(sorted(found))


def _older(entry: os.DirEntry[str], cut: float) -> bool:
    """Whether ``entry`` is a folder or a link (not followed) last changed at or before ``cut``."""
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return False  # deleted while the root was read
    return (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)) and st.st_mtime <= cut
