"""Run a command confined to one workspace, with bubblewrap (`bwrap`).

What a confined command sees and may do:

- its own mount namespace built from scratch: ``/usr`` (and the ``/bin``,
  ``/lib*`` links), the Python installation and virtual environment, a few
  ``/etc`` files and a synthetic ``/etc/passwd`` - all read-only; ``/proc`` of
  its own pid namespace, a minimal ``/dev``, a size-capped ``/tmp`` tmpfs, and
  the workspace at ``/workspace``, the only writable host directory. Nothing
  else of the host file system exists inside (``/root``, ``/work``, the task's
  hidden tests, the ``evoharness`` package's own data are absent or covered by
  an empty tmpfs).
- no network (its own, empty network namespace), its own pid / IPC / UTS
  namespaces, a new session (no terminal injection), no capabilities.
- a seccomp filter (`seccomp_program`, loaded by bwrap's ``--seccomp``) that
  fails the kernel calls a build-and-test workload never needs and that widen
  the kernel surface: the keyring (``keyctl``, ``add_key``, ``request_key``:
  keys outlive the sandbox), ``ptrace`` and cross-process memory access, every
  mount and namespace call (``mount``, ``unshare``, ``setns``, ``clone`` /
  ``clone3`` with a ``CLONE_NEW*`` flag: no nested user namespace), ``bpf``,
  ``perf_event_open``, ``userfaultfd``, io_uring, module loading, ``kexec``,
  clocks and ``TIOCSTI``. They fail with EPERM (``clone3``: ENOSYS, so libc
  falls back to ``clone``, whose flags the filter can read). The filter is
  built with libseccomp through `pyseccomp`; where it cannot be built the
  sandbox refuses to start (`SandboxUnavailable`), never running unfiltered.
- as root (the supported mode): a dedicated unprivileged uid per sandbox
  (``setpriv``), so that ``RLIMIT_NPROC`` bounds its processes without
  counting anybody else's; per-process rlimits (``prlimit``) on CPU seconds,
  address space, processes, file size, open files and core dumps.
- a host-side watchdog ends the whole sandbox (SIGKILL to bwrap; the kernel
  then kills every process of its pid namespace) at the wall-time limit, when
  the summed RSS of its processes exceeds the memory limit, or when the
  workspace grows past the disk limit or its entry count (checked every 0.5 s
  and when the command ends; a workspace found past a bound may only shrink).
  That watchdog reports; the kernel enforces: a workspace on a `WorkspaceFS`
  (a size- and inode-limited tmpfs, as the scaffold and the scorer use) cannot
  outgrow it between two checks (ENOSPC), whatever writes it (``fallocate``
  included).
- as root, where a memory cgroup can be made (`MemoryCgroup`: v1, or v2 with
  the memory controller delegated), the whole sandbox runs in its own group
  with the memory limit: the kernel then also bounds what no process's RSS
  shows (SysV shared memory, memfd files), and an OOM kill there ends the
  sandbox. Without one, only the RSS watchdog bounds memory.

Output is captured through a pipe: at most ``output_bytes`` are kept (head and
tail, with a visible marker in between); the rest is read and discarded, so a
command printing gigabytes costs the host nothing but time.

`SandboxUnavailable` is raised where confinement is impossible (bwrap missing,
namespaces refused): the caller never runs anything unconfined.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

WORKSPACE = "/workspace"
_MB = 1 << 20


class SandboxUnavailable(RuntimeError):
    """Confinement is impossible on this machine (bwrap missing or refused)."""


class SandboxError(RuntimeError):
    """The sandbox itself failed to start a command (a harness fault, not the command's)."""


@dataclass(frozen=True)
class Limits:
    """Bounds of one confined command.

    Attributes:
        wall_s: wall-clock seconds before the whole sandbox is killed.
        cpu_s: CPU seconds per process (RLIMIT_CPU; SIGXCPU then SIGKILL).
        memory_mb: address space per process (RLIMIT_AS) and summed resident
            memory of all the sandbox's processes (watchdog), MiB.
        processes: processes + threads of the sandbox's uid (RLIMIT_NPROC).
        file_size_mb: largest file a process may write (RLIMIT_FSIZE), MiB.
        open_files: RLIMIT_NOFILE.
        disk_mb: largest workspace size (watchdog, checked every 0.5 s), MiB.
        max_files: most entries (files, directories, links) in the workspace
            (watchdog): empty files take no blocks, so `disk_mb` alone would let
            a command exhaust the host file system's inodes.
        tmp_mb: size of the ``/tmp`` tmpfs, MiB.
        output_bytes: captured output kept (head + tail).
    """

    wall_s: float = 60.0
    cpu_s: int = 60
    memory_mb: int = 2048
    processes: int = 64
    file_size_mb: int = 64
    open_files: int = 256
    disk_mb: int = 512
    max_files: int = 20_000
    tmp_mb: int = 128
    output_bytes: int = 32_000


@dataclass
class RunResult:
    """What a confined command did.

    Attributes:
        exit_code: the command's exit status (128 + signal when a signal ended it
            inside; -9 when the watchdog killed the sandbox).
        output: stdout and stderr interleaved, at most ``Limits.output_bytes``
            (decoded UTF-8 with replacement), truncated with a visible marker.
        output_total: bytes the command wrote in all.
        killed: why the watchdog killed it (``wall_time``, ``memory``, ``disk``,
            ``files``), else None.
        wall_s: seconds from start to exit.
    """

    exit_code: int
    output: str
    output_total: int
    killed: str | None = None
    wall_s: float = 0.0

    @property
    def timed_out(self) -> bool:
        return self.killed == "wall_time"


def truncate_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters: head and tail kept, with a
    marker saying how much was left out."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return (
        text[:head] + f"\n[... {len(text) - head - tail} characters truncated ...]\n" + (text[-tail:] if tail else "")
    )


def require_bwrap() -> str:
    """The bwrap executable.

    Raises:
        SandboxUnavailable: bwrap is not installed.
    """
    exe = shutil.which("bwrap")
    if not exe:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; commands are never run unconfined. "
            "Install it: apt-get install -y bubblewrap"
        )
    return exe


def _proc_uid_stats(uid: int) -> tuple[list[int], int]:
    """Pids of the live processes of `uid` and their summed RSS in bytes."""
    pids, rss = [], 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        if uid_line.split()[1:2] != [str(uid)]:
            continue
        pids.append(int(name))
        for ln in status.splitlines():
            if ln.startswith("VmRSS:"):
                rss += int(ln.split()[1]) * 1024
    return pids, rss


def dir_usage(path: Path, stop_bytes: int | None = None, stop_entries: int | None = None) -> tuple[int, int]:
    """(bytes allocated, entries) under `path`, symlinks not followed; stops
    counting once either passes its `stop_*` bound.

    Walks by directory file descriptors (``openat``), so a tree nested past
    PATH_MAX is counted too: by path, ``scandir`` fails there and whatever lies
    below would be invisible. A tree too deep to walk (no descriptor left)
    reads as over any bound: entries = ``sys.maxsize``.
    """
    total, n = 0, 0
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        root = os.open(path, flags)
    except OSError:
        return 0, 0
    stack: list[tuple[int, list[str]]] = []  # (directory fd, its subdirectories still to visit)
    fd: int | None = root
    try:
        while fd is not None or stack:
            if fd is not None:
                subdirs = []
                try:
                    with os.scandir(fd) as it:
                        entries = list(it)
                except OSError:
                    entries = []
                n += len(entries)
                for e in entries:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append(e.name)
                stack.append((fd, subdirs))
                fd = None
                if (stop_bytes is not None and total > stop_bytes) or (stop_entries is not None and n > stop_entries):
                    break
            parent, todo = stack[-1]
            if not todo:
                os.close(parent)
                stack.pop()
                continue
            try:
                fd = os.open(todo.pop(), flags, dir_fd=parent)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    return total, sys.maxsize
                fd = None
    finally:
        for d, _ in stack:
            os.close(d)
        if fd is not None:
            os.close(fd)
    return total, n


def dir_size(path: Path, stop_at: int | None = None) -> int:
    """Bytes allocated under `path` (symlinks not followed); stops counting past `stop_at`."""
    return dir_usage(path, stop_bytes=stop_at)[0]


# ---- seccomp ------------------------------------------------------------------------

# Denied with EPERM. Names the running kernel's libseccomp does not know are skipped (an old
# libseccomp predates fsopen & co.; the kernel then rejects them as unknown anyway).
SECCOMP_DENIED = (
    "keyctl",
    "add_key",
    "request_key",  # the kernel keyring outlives the sandbox
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",  # other processes' memory
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",  # mounts and namespaces
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "name_to_handle_at",
    "open_by_handle_at",  # file handles bypass the mount view
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "vhangup",
    "uselib",
)
# clone flags that create namespaces (CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET)
CLONE_NAMESPACE_FLAGS = (0x80, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_TIOCSTI = 0x5412
_SECCOMP: bytes | None = None
_SECCOMP_LOCK = threading.Lock()


def seccomp_program() -> bytes:
    """The sandbox's seccomp filter as a classic-BPF program (bwrap's ``--seccomp`` format).

    Built once per process with libseccomp (`pyseccomp`, a ctypes binding to the
    system's ``libseccomp.so.2``, which bubblewrap itself depends on): default
    allow; `SECCOMP_DENIED` and ``TIOCSTI`` fail with EPERM; ``clone`` with any of
    `CLONE_NAMESPACE_FLAGS` fails with EPERM; ``clone3`` (its flags sit behind a
    pointer the filter cannot read) fails with ENOSYS, so libc falls back to
    ``clone``. System calls of another architecture (32-bit ``int 0x80`` on
    x86-64) kill the process: libseccomp's default for a foreign architecture.

    Raises:
        SandboxUnavailable: pyseccomp or libseccomp is missing (never run unfiltered).
    """
    global _SECCOMP
    with _SECCOMP_LOCK:
        if _SECCOMP is not None:
            return _SECCOMP
        try:
            import pyseccomp as sc
        except (ImportError, OSError, AttributeError, TypeError) as e:  # TypeError: libseccomp.so not found
            raise SandboxUnavailable(
                f"cannot build the sandbox's seccomp filter ({type(e).__name__}: {e}); commands are never run "
                "unfiltered. Install libseccomp (apt-get install -y libseccomp2) and pyseccomp "
                "(pip install pyseccomp==0.1.2, a dependency of this package)"
            ) from e
        try:
            f = sc.SyscallFilter(sc.ALLOW)
            eperm = sc.ERRNO(errno.EPERM)
            for name in SECCOMP_DENIED:
                try:
                    f.add_rule(eperm, name)
                except (OSError, ValueError):  # unknown to this libseccomp / architecture
                    continue
            for flag in CLONE_NAMESPACE_FLAGS:
                f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
            f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
            f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
            with tempfile.TemporaryFile() as t:
                f.export_bpf(t)
                t.seek(0)
                prog = t.read()
        except OSError as e:
            raise SandboxUnavailable(f"libseccomp failed to build the sandbox's filter: {e}") from e
        if not prog or len(prog) % 8:
            raise SandboxUnavailable(f"libseccomp produced a malformed filter ({len(prog)} bytes)")
        _SECCOMP = prog
        return prog


# ---- agent-controlled trees, walked without following links ----------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SKIP_NAMES = frozenset({"__pycache__", ".pytest_cache", ".git"})


def walk_tree(root: Path | int, max_depth: int = 10_000):
    """Yield ``(dir_fd, rel_dir, entry, depth)`` for every entry under `root`, parents first.

    Iterative, by directory file descriptors (``openat`` with ``O_NOFOLLOW``): no
    symlink is ever followed, a tree nested past PATH_MAX or the interpreter's
    recursion limit is walked all the same, and nothing outside `root` is
    reached. ``dir_fd`` stays open until the directory's entries have been
    yielded. Directories deeper than `max_depth` are not entered; unreadable ones
    are skipped. `root` may be an open directory descriptor (not closed here).
    """
    root_fd = root if isinstance(root, int) else os.open(root, _DIR_FLAGS)
    stack: list[tuple[int, str, int]] = [(root_fd, "", 0)]
    try:
        while stack:
            fd, rel, depth = stack.pop()
            try:
                try:
                    with os.scandir(fd) as it:
                        entries = list(it)
                except OSError:
                    continue
                subdirs = []
                for e in entries:
                    yield fd, rel, e, depth
                    try:
                        if e.is_dir(follow_symlinks=False) and depth < max_depth:
                            subdirs.append(e.name)
                    except OSError:
                        continue
                for name in reversed(subdirs):
                    try:
                        stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), f"{rel}{name}/", depth + 1))
                    except OSError:
                        continue
            finally:
                if fd != root_fd:
                    os.close(fd)
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)
        if not isinstance(root, int):
            os.close(root_fd)


def has_regular_file(root: Path, skip: frozenset[str] = SKIP_NAMES) -> bool:
    """True when `root` holds a regular file (links not followed, `skip` directories ignored)."""
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return False
    try:
        for _, rel, e, _ in walk_tree(root_fd):
            if any(part in skip for part in rel.split("/")):
                continue
            try:
                if e.is_file(follow_symlinks=False):
                    return True
            except OSError:
                continue
        return False
    finally:
        os.close(root_fd)


@dataclass
class CopyReport:
    """What `copy_tree` did. Units: bytes (apparent sizes), entries.

    Attributes:
        bytes: apparent bytes of the regular files copied (holes of sparse files count).
        entries: files, directories and links created.
        skipped: how many entries were left out (over a bound, too deep, special, unreadable).
        examples: up to 20 of the skipped relative paths, with why.
    """

    bytes: int = 0
    entries: int = 0
    skipped: int = 0
    examples: list[str] = field(default_factory=list)

    def skip(self, rel: str, why: str) -> None:
        self.skipped += 1
        if len(self.examples) < 20:
            self.examples.append(f"{shown(rel)}: {why}")


def shown(name: str) -> str:
    """A file name as printable text (undecodable bytes as U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def copy_tree(
    src: Path,
    dst: Path,
    max_bytes: int,
    max_entries: int,
    max_depth: int = 64,
    owner: int | None = None,
    skip: frozenset[str] = SKIP_NAMES,
) -> CopyReport:
    """Copy the agent-controlled tree `src` into the existing directory `dst`, bounded.

    Every operation goes through directory descriptors with ``O_NOFOLLOW``:
    symlinks are copied as links (never followed), FIFOs, sockets and devices
    are skipped, and nothing outside `src` is read nor outside `dst` written.
    Regular files are counted by apparent size (``st_size``), so a sparse file
    costs what its copy will take; a file that would pass `max_bytes`, an entry
    past `max_entries`, a directory deeper than `max_depth`, or a name in `skip`
    is left out (counted in the report) and the copy goes on. Iterative: no
    depth of nesting raises RecursionError.

    Args:
        owner: uid (= gid) given to every entry created (None: the caller's).

    Raises:
        OSError: `src` or `dst` cannot be opened as directories (a host fault).
    """
    rep = CopyReport()
    src_root = os.open(src, _DIR_FLAGS)
    try:
        dst_root = os.open(dst, _DIR_FLAGS)
    except OSError:
        os.close(src_root)
        raise
    stack: list[tuple[int, int, str, int]] = [(src_root, dst_root, "", 0)]  # (src fd, dst fd, rel dir, depth)
    try:
        while stack:
            sfd, dfd, rel, depth = stack.pop()
            try:
                try:
                    with os.scandir(sfd) as it:
                        entries = sorted(it, key=lambda e: e.name)
                except OSError:
                    rep.skip(rel or ".", "unreadable directory")
                    continue
                subdirs: list[tuple[int, int, str, int]] = []
                for e in entries:
                    path = rel + e.name
                    if e.name in skip:
                        continue
                    if rep.entries >= max_entries:
                        rep.skip(path, f"past {max_entries} entries")
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if depth + 1 > max_depth:
                                rep.skip(path, f"deeper than {max_depth} levels")
                                continue
                            os.mkdir(e.name, 0o755, dir_fd=dfd)
                            if owner is not None:
                                os.chown(e.name, owner, owner, dir_fd=dfd, follow_symlinks=False)
                            s_sub = os.open(e.name, _DIR_FLAGS, dir_fd=sfd)
                            try:
                                d_sub = os.open(e.name, _DIR_FLAGS, dir_fd=dfd)
                            except OSError:
                                os.close(s_sub)
                                raise
                            subdirs.append((s_sub, d_sub, path + "/", depth + 1))
                        elif stat.S_ISLNK(st.st_mode):
                            os.symlink(os.readlink(e.name, dir_fd=sfd), e.name, dir_fd=dfd)
                            if owner is not None:
                                os.chown(e.name, owner, owner, dir_fd=dfd, follow_symlinks=False)
                        elif stat.S_ISREG(st.st_mode):
                            if rep.bytes + st.st_size > max_bytes:
                                rep.skip(path, f"{st.st_size} bytes would pass the copy's bound of {max_bytes}")
                                continue
                            _copy_file(sfd, dfd, e.name, st, owner)
                            rep.bytes += st.st_size
                        else:
                            rep.skip(path, "not a regular file, directory or link")
                            continue
                    except OSError as err:
                        rep.skip(path, err.strerror or str(err))
                        continue
                    rep.entries += 1
                stack.extend(reversed(subdirs))
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        for sfd, dfd, _, _ in stack:
            os.close(sfd)
            os.close(dfd)
    return rep


def _copy_file(sfd: int, dfd: int, name: str, st: os.stat_result, owner: int | None) -> None:
    fi = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
    try:
        if not stat.S_ISREG(os.fstat(fi).st_mode):  # replaced since the scan: nothing of the agent's should run now
            raise OSError(errno.EINVAL, "not a regular file")
        fo = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            (st.st_mode & 0o755) | 0o600,
            dir_fd=dfd,
        )
        try:
            left, off = st.st_size, 0
            while left > 0:
                n = os.sendfile(fo, fi, off, min(left, 1 << 24))
                if n == 0:
                    break
                off, left = off + n, left - n
            if owner is not None:
                os.fchown(fo, owner, owner)
        finally:
            os.close(fo)
    finally:
        os.close(fi)


# ---- a kernel-bounded workspace --------------------------------------------------------

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


class WorkspaceFS:
    """A tmpfs of `size_mb` MiB and `max_files` inodes mounted at `path` (root only).

    The kernel, not a watchdog, bounds what may be written there: past the size
    or the inode count every write fails with ENOSPC, ``fallocate`` and sparse
    files included, whatever runs and however fast. Its pages are memory, not
    disk: `size_mb` is reserved from neither, only a ceiling.

    Usage: ``fs = WorkspaceFS(path, 512, 20_000).mount()`` ... ``fs.unmount()``
    (a context manager too). `mount` moves what `path` held onto the new file
    system (a bounded `copy_tree`); `unmount` detaches it, and every file on it
    is gone.

    Raises:
        SandboxUnavailable: not root, or the kernel refused the mount.
    """

    def __init__(self, path: Path, size_mb: int, max_files: int) -> None:
        self.path = Path(path)
        self.size_mb, self.max_files = size_mb, max_files
        self.mounted = False

    @staticmethod
    def available() -> bool:
        """A tmpfs can be mounted here (running as root)."""
        return os.geteuid() == 0

    def mount(self) -> WorkspaceFS:
        if not self.available():
            raise SandboxUnavailable("a kernel-bounded workspace (tmpfs) needs root")
        self.path.mkdir(parents=True, exist_ok=True)
        before = None
        if any(os.scandir(self.path)):
            before = self.path.with_name(self.path.name + f".pre-{secrets.token_hex(4)}")
            os.rename(self.path, before)
            self.path.mkdir()
        opts = f"size={self.size_mb * _MB},nr_inodes={self.max_files + 16},mode=0755".encode()
        libc = _libc()
        if libc.mount(b"tmpfs", os.fsencode(self.path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
            err = ctypes_errno()
            raise SandboxUnavailable(f"cannot mount a tmpfs workspace at {self.path}: {os.strerror(err)}")
        self.mounted = True
        if before is not None:
            try:
                copy_tree(before, self.path, self.size_mb * _MB, self.max_files, max_depth=10_000, skip=frozenset())
            finally:
                shutil.rmtree(before, ignore_errors=True)
        return self

    def adopt(self) -> WorkspaceFS:
        """Take charge of a tmpfs already mounted at `path` (left by a process that died)."""
        self.mounted = os.path.ismount(self.path)
        return self

    def unmount(self) -> None:
        """Detach the file system (its files are freed once nothing holds them)."""
        if self.mounted:
            if _libc().umount2(os.fsencode(self.path), _MNT_DETACH) != 0:
                raise OSError(ctypes_errno(), f"cannot unmount {self.path}")
            self.mounted = False

    def __enter__(self) -> WorkspaceFS:
        return self.mount()

    def __exit__(self, *exc) -> None:
        self.unmount()


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()


class MemoryCgroup:
    """A memory cgroup of one sandboxed command: the kernel's bound on all of its memory.

    Per-process RLIMIT_AS and an RSS watchdog miss memory no process maps (SysV
    shared memory after ``shmdt``, memfd files): a group charges it all. Made as a
    child of this process's own memory cgroup (v1 ``memory.limit_in_bytes``, or v2
    ``memory.max`` where the parent delegates the controller).
    """

    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version

    @staticmethod
    def parent() -> tuple[Path, int] | None:
        """This process's memory cgroup directory and version, if a child can be made there."""
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        for ln in lines:
            _, ctrls, rel = ln.split(":", 2)
            if "memory" in ctrls.split(","):
                d = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
                if (d / "memory.limit_in_bytes").is_file() and os.access(d, os.W_OK):
                    return d, 1
        for ln in lines:
            if ln.startswith("0::"):
                for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                    d = root / ln[3:].lstrip("/")
                    try:
                        delegated = "memory" in (d / "cgroup.subtree_control").read_text().split()
                    except OSError:
                        continue
                    if delegated and os.access(d, os.W_OK):
                        return d, 2
        return None

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryCgroup | None:
        """A new group capped at `limit_bytes`, or None where none can be made."""
        found = cls.parent()
        if found is None:
            return None
        parent, version = found
        path = parent / name
        try:
            path.mkdir()
            (path / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit_bytes))
            if version == 2:
                (path / "memory.swap.max").write_text("0") if (path / "memory.swap.max").exists() else None
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
            return None
        return cls(path, version)

    @property
    def procs(self) -> str:
        return str(self.path / "cgroup.procs")

    def oom_kills(self) -> int:
        """OOM kills inside the group so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for ln in (self.path / name).read_text().splitlines():
                k, _, v = ln.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Remove the group. Killed processes may take a moment to leave it (memory being
        freed): after 1 s of retries here, a background thread keeps trying for a minute."""
        if not self._try_remove(50):
            threading.Thread(target=self._try_remove, args=(600, 0.1), daemon=True).start()

    def _try_remove(self, tries: int, pause_s: float = 0.02) -> bool:
        for _ in range(tries):
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(pause_s)
        return False


@dataclass
class Sandbox:
    """Confined command execution over one host workspace directory.

    Args:
        workspace: host directory mounted read-write at ``/workspace``.
        limits: default `Limits` of each command.
        ro_binds: extra read-only mounts, host path -> sandbox path (e.g. hidden
            tests at scoring time).
        hidden: host paths that must stay invisible even if they lie inside a
            read-only mount (covered by an empty tmpfs). The task pack and the
            ``evoharness`` package directory are always added.

    Raises:
        SandboxUnavailable: bwrap missing.
    """

    workspace: Path
    limits: Limits = field(default_factory=Limits)
    ro_binds: dict[str, str] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bwrap = require_bwrap()
        self._seccomp = seccomp_program()  # fails loudly here, before anything could run unfiltered
        self.workspace = Path(self.workspace).resolve()
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.privileged = os.geteuid() == 0
        self.uid = self._pick_uid() if self.privileged else os.getuid()
        self._etc = Path(tempfile.mkdtemp(prefix="evo-sbx-etc-"))
        (self._etc / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nagent:x:{self.uid}:{self.uid}:agent:"
            f"{WORKSPACE}:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        )
        (self._etc / "group").write_text(f"root:x:0:\nagent:x:{self.uid}:\nnogroup:x:65534:\n")
        self.own_tree()

    # ---- set-up -------------------------------------------------------------------

    @staticmethod
    def _pick_uid() -> int:
        """A uid no live process uses, from a range no distribution allocates."""
        for _ in range(20):
            uid = 200_000 + secrets.randbelow(800_000)
            if not _proc_uid_stats(uid)[0]:
                return uid
        raise SandboxUnavailable("no free uid for the sandbox")

    def own_tree(self, path: Path | None = None) -> None:
        """Give the sandbox's uid ownership of `path` (default: the whole
        workspace), so that confined commands may change what the host wrote."""
        if not self.privileged:
            return
        root = Path(path) if path is not None else self.workspace
        os.lchown(root, self.uid, self.uid)
        if root.is_dir() and not root.is_symlink():
            for fd, _, e, _ in walk_tree(root):  # iterative, links never followed: any depth of nesting
                try:
                    os.chown(e.name, self.uid, self.uid, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    pass

    def _system_mounts(self) -> list[str]:
        args: list[str] = ["--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for f in (
            "/etc/ld.so.cache",
            "/etc/ld.so.conf",
            "/etc/localtime",
            "/etc/nsswitch.conf",
            "/etc/alternatives",
            "/etc/mime.types",
        ):
            args += ["--ro-bind-try", f, f]
        args += [
            "--ro-bind",
            str(self._etc / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(self._etc / "group"),
            "/etc/group",
        ]
        return args

    def _python_roots(self) -> list[str]:
        """Host directories the sandbox's Python needs (read-only, same paths)."""
        roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
        roots.add(sys.prefix)  # the venv as its scripts' shebangs name it
        return sorted(r for r in roots if not r.startswith("/usr/") and r != "/usr")

    def _argv(
        self,
        limits: Limits,
        extra_ro: dict[str, str],
        extra_rw: dict[str, str],
        extra_env: dict[str, str],
        seccomp_fd: int,
        ro_overlays: dict[str, str] | None = None,
    ) -> list[str]:
        binds = {**{r: r for r in self._python_roots()}, **self.ro_binds, **extra_ro}
        dests = [WORKSPACE, *binds.values(), *extra_rw.values()]
        parents = sorted(
            {str(p) for d in dests for p in Path(d).parents if str(p) != "/" and not str(p).startswith("/usr")}
            | {"/etc"}
        )
        argv = [
            self.bwrap,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--seccomp",
            str(seccomp_fd),
        ]
        if self.privileged:
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            argv += ["--unshare-user"]
        # /tmp first: mounts are stacked in order, so a venv or project under the host's /tmp
        # (a CI checkout, say) must be bound on top of the tmpfs, not hidden beneath it
        argv += ["--size", str(limits.tmp_mb * _MB), "--perms", "1777", "--tmpfs", "/tmp"]
        for p in parents:  # bwrap would create them 0700: the sandbox's uid could not traverse them
            argv += ["--perms", "0755", "--dir", p]
        argv += self._system_mounts()
        for src, dst in binds.items():
            argv += ["--ro-bind", src, dst]
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self.workspace), WORKSPACE]
        for src, dst in extra_rw.items():
            argv += ["--bind", src, dst]
        for src, dst in (ro_overlays or {}).items():  # over the workspace: after its bind
            argv += ["--ro-bind", src, dst]
        for h in self._hidden_paths(binds):
            argv += ["--tmpfs", h]
        env = {
            "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": WORKSPACE,
            "USER": "agent",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONPATH": WORKSPACE,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            **extra_env,
        }
        argv += ["--chdir", WORKSPACE, "--clearenv"]
        for k, v in env.items():
            argv += ["--setenv", k, v]
        argv.append("--")
        if self.privileged:
            argv += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
            nproc = limits.processes
        else:  # RLIMIT_NPROC counts every process of the real user: leave room for the others
            nproc = len(_proc_uid_stats(self.uid)[0]) + limits.processes
        argv += [
            "prlimit",
            f"--cpu={limits.cpu_s}",
            f"--as={limits.memory_mb * _MB}",
            f"--nproc={nproc}",
            f"--fsize={limits.file_size_mb * _MB}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
        ]
        return argv

    def _hidden_paths(self, binds: dict[str, str]) -> list[str]:
        """Paths inside the read-only mounts to cover with an empty tmpfs."""
        import evoharness

        wanted = [os.path.realpath(h) for h in self.hidden] + [os.path.dirname(os.path.realpath(evoharness.__file__))]
        out = []
        for h in wanted:
            for src, dst in binds.items():
                src = os.path.realpath(src)
                if h == src or h.startswith(src + "/"):
                    out.append(dst + h[len(src) :])
        return sorted(set(out))

    # ---- running ------------------------------------------------------------------

    def run(
        self,
        command: str | list[str],
        limits: Limits | None = None,
        extra_ro: dict[str, str] | None = None,
        extra_rw: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
        ro_overlays: dict[str, str] | None = None,
        **overrides,
    ) -> RunResult:
        """Run `command` confined (a string goes to ``bash -c``; cwd ``/workspace``).

        Args:
            command: shell string or argv.
            limits: bounds (default: the sandbox's); ``overrides`` replace fields,
                e.g. ``run(cmd, wall_s=5)``.
            extra_ro / extra_rw: extra read-only / writable mounts (host -> sandbox
                path) for this command only; writable ones should belong to `uid`.
            env: extra environment variables (override the defaults).
            pass_fds: host file descriptors the command inherits, same numbers
                (e.g. the write end of a pipe the host reads results from).
            ro_overlays: read-only mounts over paths inside ``/workspace`` (host ->
                sandbox path), mounted after the workspace; each mount point must
                exist in the workspace as a real file or directory (no link on
                its way), as `scorer.place_mount_point` makes it.

        Raises:
            SandboxError: bwrap could not set the sandbox up.
        """
        lim = replace(limits or self.limits, **overrides)
        # The workspace as the command finds it. Past a bound already (a burst of an earlier
        # command between two checks), the command may only shrink it: no file may grow
        # (RLIMIT_FSIZE 0) and any new entry or byte ends it at once, checked every 20 ms.
        used0, n0 = dir_usage(self.workspace)
        over = used0 > lim.disk_mb * _MB or n0 > lim.max_files
        bound = (
            (used0, min(n0, lim.max_files) if n0 == sys.maxsize else n0) if over else (lim.disk_mb * _MB, lim.max_files)
        )
        if over:
            lim = replace(lim, file_size_mb=0)
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        # stderr of the command joins stdout inside; the outer stderr carries only the set-up's errors
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        # the filter reaches bwrap through a pipe (a few hundred bytes: within the pipe's buffer)
        sc_read, sc_write = os.pipe()
        try:
            os.write(sc_write, self._seccomp)
        finally:
            os.close(sc_write)
        full = self._argv(lim, extra_ro or {}, extra_rw or {}, env or {}, sc_read, ro_overlays) + argv
        cg = (
            MemoryCgroup.create(f"evo-sbx-{self.uid}-{secrets.token_hex(4)}", lim.memory_mb * _MB)
            if self.privileged
            else None
        )
        if cg is not None:  # the shell joins the group, then becomes bwrap: nothing forks outside it
            full = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs, *full]
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(*pass_fds, sc_read),
            )
        except OSError as e:
            if cg is not None:
                cg.remove()
            raise SandboxError(f"cannot start bwrap: {e}") from e
        finally:
            os.close(sc_read)
        head, tail, total = bytearray(), deque(), [0]
        keep_head, keep_tail = lim.output_bytes * 2 // 3, lim.output_bytes - lim.output_bytes * 2 // 3
        err = bytearray()

        def pump_out() -> None:
            tail_len = 0
            while chunk := proc.stdout.read1(1 << 16):
                total[0] += len(chunk)
                room = keep_head - len(head)
                if room > 0:
                    head.extend(chunk[:room])
                    chunk = chunk[room:]
                if chunk and keep_tail:
                    tail.append(chunk)
                    tail_len += len(chunk)
                    while tail and tail_len - len(tail[0]) >= keep_tail:
                        tail_len -= len(tail.popleft())

        def pump_err() -> None:
            while chunk := proc.stderr.read1(1 << 14):
                if len(err) < 1 << 16:
                    err.extend(chunk)

        readers = [threading.Thread(target=pump_out, daemon=True), threading.Thread(target=pump_err, daemon=True)]
        for t in readers:
            t.start()
        killed = self._watch(proc, lim, t0, cg, bound, 0.02 if over else 0.5)
        rc = proc.wait()
        for t in readers:
            t.join(timeout=5)
        self._reap()
        if cg is not None:
            if killed is None and cg.oom_kills():
                killed = "memory"
            cg.remove()
        if killed is None:  # a burst that ended between two checks: too late to stop, not to say
            killed = self._over(bound)
        wall = time.monotonic() - t0
        if killed is None and rc != 0 and (err.startswith(b"bwrap:") or err.startswith(b"setpriv:")):
            raise SandboxError(err.decode("utf-8", "replace").strip()[:2000])
        tail_bytes = b"".join(tail)
        dropped = total[0] - len(head) - len(tail_bytes)
        if dropped > 0:
            tail_bytes = tail_bytes[-keep_tail:] if keep_tail else b""
            dropped = total[0] - len(head) - len(tail_bytes)
            out = (
                head.decode("utf-8", "replace")
                + f"\n[... {dropped} bytes of output truncated ...]\n"
                + tail_bytes.decode("utf-8", "replace")
            )
        else:
            out = (bytes(head) + tail_bytes).decode("utf-8", "replace")
        return RunResult(
            exit_code=-9 if killed else rc, output=out, output_total=total[0], killed=killed, wall_s=round(wall, 3)
        )

    def _over(self, bound: tuple[int, int]) -> str | None:
        """``disk`` / ``files`` when the workspace passes `bound` (bytes, entries), else None."""
        used, n = dir_usage(self.workspace, stop_bytes=bound[0], stop_entries=bound[1])
        return "disk" if used > bound[0] else "files" if n > bound[1] else None

    def _watch(
        self,
        proc: subprocess.Popen,
        lim: Limits,
        t0: float,
        cg: MemoryCgroup | None,
        bound: tuple[int, int],
        every_s: float,
    ) -> str | None:
        """Poll until `proc` exits; kill the sandbox at a limit and say which.

        Args:
            bound: (bytes, entries) the workspace may reach.
            every_s: seconds between two memory / workspace checks.
        """
        next_check = t0 + min(every_s, 0.05)
        while proc.poll() is None:
            now = time.monotonic()
            reason = None
            if now - t0 > lim.wall_s:
                reason = "wall_time"
            elif now >= next_check:
                next_check = now + every_s
                if self.privileged and (
                    _proc_uid_stats(self.uid)[1] > lim.memory_mb * _MB or (cg is not None and cg.oom_kills())
                ):
                    reason = "memory"
                else:
                    reason = self._over(bound)
            if reason:
                self._kill(proc)
                return reason
            try:
                proc.wait(timeout=min(0.05, every_s))
            except subprocess.TimeoutExpired:
                pass
        return None

    def _kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap; its pid-namespace init then takes every process down
        except ProcessLookupError:
            pass
        self._reap()

    def _reap(self) -> None:
        """SIGKILL anything still running under the sandbox's uid (root mode)."""
        if not self.privileged:
            return
        for pid in _proc_uid_stats(self.uid)[0]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Kill leftovers and remove the sandbox's private files (not the workspace)."""
        self._reap()
        shutil.rmtree(self._etc, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
