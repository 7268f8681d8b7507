"""Every file plansim writes is written whole, and ``--format json`` prints only JSON.

Files. A file is written under a temporary name in its own folder and renamed onto its name (``os.replace``, atomic
on one file system), so a reader sees the previous file or the new one, never part of one: ``atomic_write_text``,
``atomic_write_bytes``, and ``atomic_path`` for writers that take a path (matplotlib's ``savefig``, pandas'
``to_csv``).

Folders (``plan``, ``compare``, ``sweep``, ``remat``, ``validate`` with ``--out DIR``). ``staged_folder`` checks
and creates ``DIR`` (a problem is one line naming the option and the fix), gives the writer a hidden staging folder
inside it (``.plansim-tmp-*``), and only when every file is written moves them into ``DIR``, one rename each. The
moves run under a lock (``DIR/.plansim.lock``, ``flock``: held by a live process only, so a killed run leaves no
stale lock) with Ctrl-C and SIGTERM held back until the last one is done. So an interrupted or failed run leaves the
previous files or none, never a cut-off file and never a mix of two runs' files; files of ``DIR`` that this run
does not write (another command's, or a chart the earlier run drew and this one does not) are left as they are. A
second writer to the same folder *waits* for the first one's renames (milliseconds; at most ``LOCK_WAIT_S`` before
it gives up with a one-line error); both runs complete and the folder holds the later run's files, whole.

Interruptions. While a file or a folder is being written, SIGINT and SIGTERM are handled by plansim (main thread
only): during the writing itself they act at once (Ctrl-C's ``KeyboardInterrupt``; SIGTERM, where nothing else
handles it, as ``SystemExit(143)``, the exit status its default action gives), so the temporary files are removed
on the way out; during plansim's own steps (making the staging folder, the renames, the clean-up) they are held
back until the step is done. A kill that cannot be caught (SIGKILL, power loss) may leave a hidden temporary file
or staging folder behind, never a partial file under a real name; the next run into that folder removes a staging
folder whose process is gone once it is ``ABANDONED_AFTER_S`` old. Files are not fsync'ed: the guarantee is
against interruption and failure of the run, not against the machine losing power.

Standard output. ``c_stdout_silenced`` points file descriptor 1 at the null device for the duration of a block,
for C libraries that print banners there (HiGHS prints its banner when its first ``Highs`` object is made, whatever
its ``output_flag``), so that ``--format json`` stays JSON.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from plansim.errors import PlansimError, shown, shown_path
from plansim.files.yamlfile import input_at, is_dir

__all__ = [
    "ABANDONED_AFTER_S",
    "LOCK_NAME",
    "LOCK_WAIT_S",
    "StagedFolder",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "c_stdout_silenced",
    "check_output_file",
    "check_output_folder",
    "output_folder",
    "refuse_inputs",
    "staged_folder",
]

#: The lock file that serializes two runs' renames into one folder.
LOCK_NAME = ".plansim.lock"
#: How long a writer waits for another process's renames into the same folder before it gives up.
LOCK_WAIT_S = 60.0
_STAGING_PREFIX = ".plansim-tmp-"


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


# -- signals --------------------------------------------------------------------------------------------------------


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Gate:
    """SIGINT and SIGTERM as a writer sees them: *closed* (the default), a signal is noted and acted on when the
    gate next opens or is taken down, so that plansim's own steps (making the staging folder, the renames, the clean
    up) are never cut in the middle; *open* (``opened()``: while the caller writes, while waiting for a lock), it is
    acted on at once. Acting on one: the handler that was there before, or for SIGTERM left at its default,
    ``SystemExit(143)`` (the exit status the default gives, with ``finally`` clauses run)."""

    def __init__(self) -> None:
        self.closed = True
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}

    def handle(self, signum: int, frame: Any) -> None:
        if self.closed:
            self.pending.append(signum)
        else:
            self.act(signum, frame)

    def act(self, signum: int, frame: Any) -> None:
        previous = self.previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

    def act_on_pending(self) -> None:
        if self.pending:
            first = self.pending[0]
            self.pending.clear()
            self.act(first, None)

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        self.closed = False
        try:
            self.act_on_pending()
            yield
        finally:
            self.closed = True


@contextlib.contextmanager
def _guarded() -> Iterator[_Gate]:
    """A closed ``_Gate`` for SIGINT and SIGTERM within the block (main thread only: elsewhere signals are left
    alone); the previous handlers are restored after it, then a signal noted meanwhile is acted on."""
    gate = _Gate()
    if _in_main_thread():
        for name in ("SIGINT", "SIGTERM"):
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            previous = signal.getsignal(signum)
            if previous is not None:  # None: a handler installed from C, which could not be put back
                gate.previous[signum] = previous
                signal.signal(signum, gate.handle)
    try:
        yield gate
    finally:
        for signum, previous in gate.previous.items():
            signal.signal(signum, previous)
        gate.act_on_pending()


# -- files ----------------------------------------------------------------------------------------------------------


def _temporary_name(path: Path) -> Path:
    """A hidden name beside ``path`` that no other writer uses, keeping its suffix (pandas and matplotlib read the
    format from it). A path without a name (``/``) is an ``IsADirectoryError``, as writing to it would be."""
    if not path.name:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write to; renamed onto ``path`` when the block ends normally, removed
    when it raises (or is interrupted). The folder must exist.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with atomic_path(folder / "a.txt") as tmp:
    ...     _ = tmp.write_text("whole")
    >>> sorted(p.name for p in folder.iterdir()), (folder / "a.txt").read_text()
    (['a.txt'], 'whole')
    """
    path = Path(path)
    tmp = _temporary_name(path)
    with _guarded() as gate:
        try:
            with gate.opened():
                yield tmp
            refuse_inputs([path], "output", path)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole (``atomic_path``); returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` whole (``atomic_path``); returns the path."""
    return atomic_write_bytes(path, text.encode(encoding))


def write_output_text(path: str | Path, text: str, option: str = "--out") -> Path:
    """Write a command's output file ``path`` whole, its folder made first (``atomic_write_text``); a system's refusal
    as one ``PlansimError`` line naming ``option``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write_text(path, text)
    except OSError as err:
        raise PlansimError(
            f"{option} {shown_path(path)}: cannot write it ({err.strerror}): choose a writable path"
        ) from None


# -- inputs ---------------------------------------------------------------------------------------------------------


def refuse_inputs(paths: Iterable[Path], option: str, out: str | Path) -> None:
    """A one-line ``PlansimError`` naming ``option`` when any of ``paths`` (files about to be replaced) is a file the
    command read (``plansim.files.yamlfile.input_at``: inside the CLI's ``recording_inputs``). Checked before the first
    file is replaced, so a refused run changes nothing."""
    for path in paths:
        source = input_at(path)
        if source is not None:
            where = "" if Path(out) == path or source == path else f" (as {shown_path(path, 40)})"
            raise PlansimError(
                f"{option} {shown_path(out)}: would write over the input file {shown_path(source, 40)}{where}: "
                "write the output elsewhere"
            )


def check_output_file(path: str | Path, option: str, inputs: Iterable[str | Path | None] = ()) -> Path:
    """``path`` as a file that ``option`` may write, before any work: a ``PlansimError`` when it is an input of the
    command (one recorded, or the same file as one of ``inputs``, the paths the command will read), a folder, or a
    name the system refuses (too long). Nothing is created."""
    if str(path) == "":
        raise PlansimError(f"{option}: empty path: give a file path")
    target = Path(path)
    refuse_inputs([target], option, target)
    for given in inputs:
        if given is not None and _same_file(target, Path(given)):
            raise PlansimError(
                f"{option} {shown_path(target)}: is the input file {shown_path(given, 40)}: write the output elsewhere"
            )
    if is_dir(target):
        raise PlansimError(f"{option} {shown_path(target)}: is a folder: give a file path")
    _check_name_lengths(target, option)
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _check_name_lengths(path: Path, option: str) -> None:
    """A one-line ``PlansimError`` when a component of ``path`` is longer than the file system takes
    (``NAME_MAX``, 255 bytes on Linux, asked of the nearest existing folder) or the whole path longer than
    ``PATH_MAX``: the same refusal the system would give when writing, given before any work."""
    existing = path.parent if str(path.parent) else Path(".")
    while not is_dir(existing) and existing != existing.parent:
        existing = existing.parent
    name_max, path_max = _system_limit(existing, "PC_NAME_MAX", 255), _system_limit(existing, "PC_PATH_MAX", 4096)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise PlansimError(
                f"{option} {shown_path(path)}: a name of {size:,} bytes ({shown(part, 20)}), longer than the "
                f"{name_max} the file system takes: choose a shorter name"
            )
    if len(os.fsencode(str(path))) >= path_max:
        raise PlansimError(
            f"{option} {shown_path(path)}: a path of {len(os.fsencode(str(path))):,} bytes, longer than the "
            f"{path_max:,} the system takes: choose a shorter path"
        )


def _system_limit(folder: Path, name: str, default: int) -> int:
    """``os.pathconf(folder, name)``, or ``default`` where the system does not say."""
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value and value > 0 else default


# -- folders --------------------------------------------------------------------------------------------------------


def check_output_folder(out: str | Path | None, option: str = "--out") -> None:
    """Before any work: a ``PlansimError`` naming ``option`` and the fix if ``out`` cannot become a folder that
    plansim writes into (it names a file, or a path under a file, or its nearest existing folder is not writable).
    Nothing is created; ``None`` (no output asked for) passes."""
    if out is None:
        return
    if str(out) == "":
        raise PlansimError(f"{option}: empty path: give a folder, e.g. {option} results/")
    directory = Path(out)
    _check_name_lengths(directory, option)
    if "\0" in str(out):
        raise PlansimError(f"{option} {shown_path(out)}: not a valid path (it holds a NUL character): choose another")
    if directory.exists() and not directory.is_dir():
        raise PlansimError(
            f"{option} {shown_path(out)}: is a file, not a folder: give a folder path (created if missing)"
        )
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PlansimError(
            f"{option} {shown_path(out)}: {shown_path(existing, 40)} is a file, so no folder can be made under it: "
            "choose another path"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PlansimError(
            f"{option} {shown_path(out)}: {shown_path(existing, 40)} is not writable: choose a folder you can write to"
        )


def output_folder(out: str | Path, option: str = "--out") -> Path:
    """``out`` as an existing folder, created (with its parents) if missing; a ``PlansimError`` naming ``option``
    and the fix if it names a file or cannot be created."""
    check_output_folder(out, option)
    directory = Path(out)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlansimError(
            f"{option} {shown_path(out)}: cannot create that folder ({_reason(err)}): choose a writable folder"
        ) from None
    return directory


class StagedFolder:
    """Where a staged writer writes (``path``, a hidden folder inside ``target``) and where its files end up."""

    def __init__(self, target: Path, path: Path) -> None:
        self.target = target
        self.path = path

    def final(self, paths: Iterable[str | Path]) -> list[Path]:
        """``paths`` written under ``path``, as they are named once moved into ``target``."""
        return [self.target / Path(p).relative_to(self.path) for p in paths]


@contextlib.contextmanager
def staged_folder(out: str | Path, option: str = "--out") -> Iterator[StagedFolder]:
    """Write a set of files into ``out`` all or nothing (see the module docstring): the block writes under
    ``StagedFolder.path``; when it ends normally every file there is moved into ``out``; when it raises, or is
    interrupted, nothing in ``out`` changes and the staging folder is removed. An ``OSError`` while writing is a
    ``PlansimError`` naming ``option``.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "run"
    >>> with staged_folder(out) as stage:
    ...     _ = (stage.path / "a.csv").write_text("x\\n1\\n")
    ...     files = stage.final([stage.path / "a.csv"])
    >>> [p.name for p in out.iterdir()], files == [out / "a.csv"]
    (['a.csv'], True)
    """
    directory = output_folder(out, option)
    with _guarded() as gate:
        staging: Path | None = None
        try:
            try:
                staging = Path(_make_staging(directory))
            except OSError as err:
                raise PlansimError(
                    f"{option} {shown_path(out)}: cannot write there ({_reason(err)}): choose a writable folder"
                ) from None
            with gate.opened():
                try:
                    yield StagedFolder(directory, staging)
                except OSError as err:
                    raise PlansimError(
                        f"{option} {shown_path(out)}: cannot write there ({_reason(err)}): choose a writable folder "
                        "with free space"
                    ) from None
            names = sorted(p.name for p in staging.iterdir())
            refuse_inputs([directory / name for name in names], option, out)
            with _folder_lock(directory, option, gate):
                for name in names:
                    os.replace(staging / name, directory / name)
        except OSError as err:
            raise PlansimError(
                f"{option} {shown_path(out)}: cannot move the files into place ({_reason(err)}): "
                "choose a folder without sub-folders named like the files"
            ) from None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


#: A staging folder is abandoned (its run was killed by a signal that cannot be caught) when the process named in
#: it is gone and it has not changed for this long; the next run into the same folder removes it.
ABANDONED_AFTER_S = 600.0


def _make_staging(directory: Path) -> str:
    """A new staging folder in ``directory``, named with this process's id; abandoned ones are removed first."""
    _remove_abandoned(directory)
    return tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{os.getpid()}-", dir=directory)


def _remove_abandoned(directory: Path, now: float | None = None) -> None:
    """Remove staging folders whose process is gone and that have not changed for ``ABANDONED_AFTER_S`` (a live
    writer's, one of another machine's process or a recent one is left alone)."""
    now = time.time() if now is None else now
    for entry in directory.glob(f"{_STAGING_PREFIX}*"):
        pid = entry.name[len(_STAGING_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            if now - entry.stat().st_mtime >= ABANDONED_AFTER_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or not a pid this system has: leave its folder alone
    return True


@contextlib.contextmanager
def _folder_lock(directory: Path, option: str, gate: _Gate | None = None) -> Iterator[None]:
    """Hold ``directory/.plansim.lock`` exclusively (``flock``, released by the kernel if the process dies),
    waiting up to ``LOCK_WAIT_S`` for another holder (with ``gate`` open while it waits: Ctrl-C still stops it).
    Where ``fcntl`` is missing (Windows), no lock is taken: each file is still replaced whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = directory / LOCK_NAME
    wait_s = LOCK_WAIT_S
    deadline = time.monotonic() + wait_s
    fd: int | None = None
    try:
        while fd is None:
            fd, owner = _try_lock(path, fcntl)
            if fd is not None:
                break
            if time.monotonic() > deadline:
                raise PlansimError(
                    f"{option} {shown_path(directory)}: another plansim{owner} is still writing there after "
                    f"{wait_s:g} s: wait for it to finish, or choose another folder"
                )
            with gate.opened() if gate is not None else contextlib.nullcontext():
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)  # closing releases the flock


def _try_lock(path: Path, fcntl: Any) -> tuple[int | None, str]:
    """The lock file's descriptor, locked, or None and `` (pid N)`` of the holder (empty when unknown)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _lock_owner(fd)
        os.close(fd)
        return None, owner
    # the holder before us may have removed the file after we opened it: then our lock is on a dead inode
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None, ""
    return fd, ""


def _lock_owner(fd: int) -> str:
    """`` (pid N)`` from a held lock file, or nothing when it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f" (pid {pid})"
    return ""


# -- standard output ------------------------------------------------------------------------------------------------

_silence_lock = threading.Lock()
_silence_depth = 0
_saved_stdout_fd: int | None = None


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (``fflush(NULL)``), where a C library's ``printf`` output may wait."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def c_stdout_silenced() -> Iterator[None]:
    """Within the block, file descriptor 1 (C-level standard output) goes to the null device; Python's
    ``sys.stdout`` is flushed first and left as it is. Nested and concurrent uses share one redirection (the last
    to leave restores it). Where descriptor 1 cannot be redirected, the block runs unchanged."""
    global _silence_depth, _saved_stdout_fd
    with _silence_lock:
        if _silence_depth == 0:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            try:
                saved = os.dup(1)
            except OSError:
                saved = None
            if saved is not None:
                null = os.open(os.devnull, os.O_WRONLY)
                try:
                    _flush_c_stdio()
                    os.dup2(null, 1)
                finally:
                    os.close(null)
            _saved_stdout_fd = saved
        _silence_depth += 1
    try:
        yield
    finally:
        with _silence_lock:
            _silence_depth -= 1
            if _silence_depth == 0 and _saved_stdout_fd is not None:
                _flush_c_stdio()
                os.dup2(_saved_stdout_fd, 1)
                os.close(_saved_stdout_fd)
                _saved_stdout_fd = None
