"""Issue 49's attacks on the repository environment, each run for real (real bwrap sandboxes,
real pytest scoring). Shared by the security tests (test_repo_attacks.py) and
benchmarks/bench_sandbox.py, which prints their table.

Each attack is ``fn(pack, tmp: Path) -> (verdict, note)`` with verdict one of
``contained`` (the attack ran and changed nothing outside it), ``scored 0`` / ``scored``
(a legitimate score, never a drop) or ``refused`` (the kernel or the gateway said no), and
raises AssertionError when the defence failed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from pathlib import Path

from evoharness.envs.repo.sandbox import Limits, Sandbox, dir_usage
from evoharness.envs.repo.scorer import score_workspace
from evoharness.envs.repo.task import load_task

# The task-agnostic reward hack of issue 49 item 3: every name is an object that equals
# everything, is callable, iterable and empty; names that look like exceptions are a class
# that inherits from the common exceptions and claims every instance and subclass.
MAGIC = """\
class _Meta(type):
    def __instancecheck__(cls, obj): return True
    def __subclasscheck__(cls, sub): return True
    def __eq__(cls, o): return True
    def __hash__(cls): return 0


class CatchAll(ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError, RuntimeError,
               metaclass=_Meta):
    pass


class _M:
    def __init__(self, *a, **k): pass
    def __eq__(self, o): return True
    def __ne__(self, o): return False
    def __hash__(self): return 0
    def __call__(self, *a, **k): return _M()
    def __iter__(self): return iter(())
    def __len__(self): return 0
    def __bool__(self): return False
    def __getattr__(self, n): return _M()
    def __getitem__(self, k): return _M()
    def __setitem__(self, k, v): pass
    def __contains__(self, k): return True
    def __enter__(self): return self
    def __exit__(self, *a): return False
    def __lt__(self, o): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __str__(self): return ""
    __repr__ = __str__
    def __int__(self): return 0
    def __float__(self): return 0.0
    def __index__(self): return 0
    def __add__(self, o): return self
    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __add__


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name.endswith(("Error", "Exception")):
        return CatchAll
    if name[:1].isupper():
        return _Meta(name, (_M,), {})
    return _M()
"""
# A variant that hands out real functions (and str-subclass results): `def` objects pass an
# "is it a function" check, and what they return equals everything all the same.
MAGIC_FUNCTIONS = MAGIC.replace(
    """    return _M()
""",
    """    class S(str):
        def __eq__(self, o): return True
        __hash__ = str.__hash__
    return lambda *a, **k: S("")
""",
)


def write_reference(task, ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    for rel, text in task.reference_files().items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def modules_under_test(task) -> list[str]:
    """Top-level modules the hidden suite imports that the reference provides (what the spec names)."""
    names = set()
    for f in task.tests_dir.rglob("test*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names.add(n.module.split(".")[0])
            elif isinstance(n, ast.Import):
                names |= {a.name.split(".")[0] for a in n.names}
    return sorted(names & {p.split("/")[0].removesuffix(".py") for p in task.reference_files()})


def magic_workspace(task, ws: Path, source: str = MAGIC) -> Path:
    for m in modules_under_test(task):
        (ws / m).mkdir(parents=True, exist_ok=True)
        (ws / m / "__init__.py").write_text(source)
    return ws


def nl2repo_task(d: Path, test_files: list[str]) -> object:
    """An NL2Repo-layout task whose hidden tests sit at `test_files` (files or directories)."""
    (d / "hidden").mkdir(parents=True)
    (d / "start.md").write_text("# tinylib\n\nBuild `tinylib` with add(a, b).\n")
    (d / "test_case_count.txt").write_text("2")
    (d / "test_files.json").write_text(json.dumps(test_files))
    suite = (
        "from tinylib import add\n\ndef test_add():\n    assert add(1, 2) == 3\n\ndef test_neg():\n"
        "    assert add(-1, -2) == -3\n"
    )
    for p in test_files:
        f = d / "hidden" / p
        if p.endswith(".py"):
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(suite)
        else:
            f.mkdir(parents=True)
            (f / "test_tiny.py").write_text(suite)
    return load_task(d)


def tinylib(ws: Path) -> Path:
    (ws / "tinylib").mkdir(parents=True)
    (ws / "tinylib" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    return ws


def in_sandbox(ws: Path, command: str, **limits) -> object:
    with Sandbox(ws, limits=Limits(**{"wall_s": 60, "cpu_s": 60, **limits})) as sb:
        return sb.run(command)


# ---- 1. escapes through agent-made links -------------------------------------------------


def escape_link_over_test_file(pack, tmp: Path):
    """test_files.json = ["tests/test_tiny.py"]; the agent makes ``tests`` a link to a host
    directory holding a test_tiny.py: the scorer must not overwrite it."""
    task = nl2repo_task(tmp / "task", ["tests/test_tiny.py"])
    host = tmp / "host"
    host.mkdir()
    (host / "test_tiny.py").write_text("HOST FILE")
    ws = tinylib(tmp / "ws")
    os.symlink(host, ws / "tests")
    o = score_workspace(task, ws, budget=1)
    assert (host / "test_tiny.py").read_text() == "HOST FILE", "the host file was overwritten"
    assert (o.status, o.reward) == ("scored", 1.0), o.detail
    return "contained", "host file untouched; hidden test mounted in the copy"


def escape_link_over_test_dir(pack, tmp: Path):
    """test_files.json = ["tests/unit"]; ``tests`` links to a host directory with a ``unit``
    directory: the scorer must not delete it."""
    task = nl2repo_task(tmp / "task", ["tests/unit"])
    host = tmp / "host"
    (host / "unit").mkdir(parents=True)
    (host / "unit" / "keep.txt").write_text("keep")
    ws = tinylib(tmp / "ws")
    os.symlink(host, ws / "tests")
    o = score_workspace(task, ws, budget=1)
    assert (host / "unit" / "keep.txt").read_text() == "keep", "the host directory was deleted"
    assert (o.status, o.reward) == ("scored", 1.0), o.detail
    return "contained", "host directory untouched"


def escape_link_to_root_in_copy(pack, tmp: Path):
    """A link to / on the hidden tests' way (``tests/unit`` -> /): the host root must not
    receive the test file."""
    name = f"test_evo_escape_{os.getpid()}_{tmp.name}.py"
    task = nl2repo_task(tmp / "task", [f"tests/unit/{name}"])
    ws = tinylib(tmp / "ws")
    (ws / "tests").mkdir()
    os.symlink("/", ws / "tests" / "unit")
    try:
        o = score_workspace(task, ws, budget=1)
        assert not Path("/", name).exists(), f"/{name} was written on the host"
    finally:
        Path("/", name).unlink(missing_ok=True)
    assert (o.status, o.reward) == ("scored", 1.0), o.detail
    return "contained", "links replaced by real directories in the scored copy"


# ---- 2. reaching "dropped" ----------------------------------------------------------------


def _broken_roman(pack, tmp: Path, code: str, **task_kw):
    task = dataclasses.replace(pack["roman_numerals"], **task_kw)
    ws = write_reference(task, tmp / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + code)
    o = score_workspace(task, ws, budget=2)
    assert o.status == "scored" and o.attempts == 1, ("dropped or retried", o.status, o.attempts, o.detail)
    return o


def dropped_pytest_exit(pack, tmp: Path):
    o = _broken_roman(pack, tmp, "\n\ndef from_roman(s):\n    import pytest\n    pytest.exit('x', returncode=3)\n")
    assert o.reward < 1 and o.detail["abnormal"], o.detail
    return "scored", f"reward {o.reward:.2f} from the passes before the exit"


def dropped_os_exit(pack, tmp: Path):
    o = _broken_roman(pack, tmp, "\n\ndef is_roman(s):\n    import os\n    os._exit(4)\n")
    assert o.reward < 1 and o.detail["abnormal"], o.detail
    return "scored", f"reward {o.reward:.2f}"


def dropped_loop_spin(pack, tmp: Path):
    """A profile hook armed at import that, once the first test is over, blocks SIGALRM and spins
    forever in pytest's loop between two tests, where no per-test alarm is armed: the run hits its
    wall limit (before: blamed on the scorer, dropped). `sys.setprofile` makes it strike at the same
    place every run; a SIGPROF timer polling for that window missed it in about one run of 15."""
    code = (
        "\n\nimport signal, sys\n\n_calls = []\n\ndef _spin(frame, event, arg):\n"
        "    caller = frame.f_back\n"
        "    if event != 'call' or caller is None or caller.f_code.co_name != 'pytest_runtestloop':\n"
        "        return\n"
        "    _calls.append(frame.f_code.co_name)\n"
        "    if len(_calls) < 3:  # the loop calls two functions per test: spin as the second test begins\n"
        "        return\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n    while True:\n        pass\n\n"
        "sys.setprofile(_spin)\n"
    )
    o = _broken_roman(pack, tmp, code, test_timeout_s=6.0, per_test_timeout_s=1.0)
    assert o.detail["abnormal"] and o.reward < 1, o.detail
    return "scored", f"reward {o.reward:.2f}; {o.detail['abnormal']}, control run healthy"


def dropped_deep_tree(pack, tmp: Path):
    """700 nested directories made by the agent (mkdir + chdir), beside a correct solution."""
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp / "ws")
    r = in_sandbox(
        ws,
        "python3 -c \"import os\nfor i in range(700):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('deep.txt', 'w').write('x')\"",
    )
    assert r.exit_code == 0, r.output
    o = score_workspace(task, ws, budget=1)
    assert (o.status, o.reward) == ("scored", 1.0), o.detail
    assert o.detail["copy"]["skipped"] >= 1
    return "scored", "copied to 64 levels, the rest skipped; no RecursionError"


def dropped_broken_conftest(pack, tmp: Path):
    task = nl2repo_task(tmp / "task", ["tests/test_tiny.py"])
    ws = tinylib(tmp / "ws")
    (ws / "conftest.py").write_text("raise ImportError('broken on purpose')\n")
    o = score_workspace(task, ws, budget=2)
    assert (o.status, o.reward, o.attempts) == ("scored", 0.0, 1), o.detail
    return "scored 0", f"abnormal: {o.detail['abnormal']}"


def dropped_bad_ini(pack, tmp: Path):
    task = nl2repo_task(tmp / "task", ["tests/test_tiny.py"])
    ws = tinylib(tmp / "ws")
    (ws / "pytest.ini").write_text("[pytest]\nminversion = 999\n")
    o = score_workspace(task, ws, budget=2)
    assert (o.status, o.reward, o.attempts) == ("scored", 0.0, 1), o.detail
    assert o.detail["exit_code"] == 4
    return "scored 0", "usage error (exit 4) from the agent's ini"


# ---- 3. the task-agnostic magic module ----------------------------------------------------


def magic_module(pack, tmp: Path, source: str = MAGIC):
    """The magic module in place of every module each pack task's suite imports."""
    from concurrent.futures import ThreadPoolExecutor

    def one(task):
        o = score_workspace(task, magic_workspace(task, tmp / task.task_id, source), budget=1)
        return task.task_id, o

    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(one, pack.values()))
    worst = max(results, key=lambda t: results[t].reward or 0)
    for tid, o in results.items():
        assert o.status == "scored" and o.reward <= 0.05, (tid, o.status, o.reward, o.detail)
    mean = sum(o.reward for o in results.values()) / len(results)
    return "scored 0", f"mean {mean:.3f}, max {results[worst].reward:.3f} ({worst}) over {len(results)} tasks"


def magic_functions(pack, tmp: Path):
    return magic_module(pack, tmp, MAGIC_FUNCTIONS)


# ---- known items: forged passes, patched tests -----------------------------------------


def tamper_empty_test_functions(pack, tmp: Path):
    """The agent's package, imported by the suite, empties every test function it finds
    (``__code__`` replaced through the garbage collector) once collection is over."""
    code = (
        "\n\nimport gc, sys, threading\n\ndef _empty():\n    pass\n\n"
        "def _patch():\n    for o in gc.get_objects():\n"
        "        if type(o).__name__ == 'function' and o.__name__.startswith('test_'):\n"
        "            try:\n                o.__code__ = _empty.__code__\n            except Exception:\n"
        "                pass\n\n"
        "_orig = to_roman\n\ndef to_roman(n, _o=_orig):\n    _patch()\n    raise NotImplementedError\n"
    )
    o = _broken_roman(pack, tmp, code)
    assert o.reward == 0.0 and o.detail["tampered"], o.detail
    return "scored 0", f"tampered: {o.detail['tampered'][0]}"


def tamper_conftest_pyfunc_call(pack, tmp: Path):
    """An NL2Repo workspace ``conftest.py`` that answers pytest_pyfunc_call: no test would run."""
    task = nl2repo_task(tmp / "task", ["tests/test_tiny.py"])
    ws = tmp / "ws"
    (ws / "tinylib").mkdir(parents=True)
    (ws / "tinylib" / "__init__.py").write_text("def add(a, b):\n    return 0\n")
    (ws / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_pyfunc_call(pyfuncitem):\n    return True\n"
    )
    o = score_workspace(task, ws, budget=1)
    assert (o.status, o.reward) == ("scored", 0.0) and o.detail["tampered"], o.detail
    return "scored 0", "workspace hook implementation detected"


def forged_unsigned_and_uncollected_passes(pack, tmp: Path):
    """Pass records written to every descriptor, and items added by a conftest under fake ids."""
    task = nl2repo_task(tmp / "task", ["tests/test_tiny.py"])
    ws = tmp / "ws"
    (ws / "tinylib").mkdir(parents=True)
    (ws / "tinylib" / "__init__.py").write_text(
        "import json, os\ndef add(a, b):\n    return 0\n"
        "rec = ''.join(json.dumps({'event': 'test', 'nodeid': f'tests/test_tiny.py::t{i}', 'when': 'call',"
        " 'outcome': 'passed'}) + '\\n' for i in range(10)).encode()\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n        os.write(fd, rec)\n"
        "    except OSError:\n        pass\n"
    )
    (ws / "conftest.py").write_text(
        "import pytest\n\ndef _ok():\n    pass\n\n"
        "def pytest_collection_modifyitems(session, config, items):\n"
        "    for i in range(5):\n"
        "        items.append(pytest.Function.from_parent(items[0].parent, name=f'test_fake{i}', callobj=_ok))\n"
    )
    o = score_workspace(task, ws, budget=1)
    assert (o.status, o.reward, o.detail["passed"]) == ("scored", 0.0, 0), o.detail
    return "scored 0", "only genuinely collected hidden node ids count"


# ---- 4. kernel surface --------------------------------------------------------------------

KERNEL_PROBE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
print("add_key", call(248, b"user", b"evo", b"secret", 6, ctypes.c_int(-2)))   # KEY_SPEC_SESSION_KEYRING
print("keyctl", call(250, 0, ctypes.c_int(-2), 0))                               # KEYCTL_GET_KEYRING_ID
print("request_key", call(249, b"user", b"evo", None, 0))
print("ptrace", call(101, 0, 0, 0, 0))                                           # PTRACE_TRACEME
print("mount", call(165, b"none", b"/tmp", b"tmpfs", 0, None))
print("unshare", call(272, 0x10000000))                                           # CLONE_NEWUSER
print("clone_newuser", call(56, 0x10000000 | 17, 0, 0, 0, 0))                     # clone(CLONE_NEWUSER|SIGCHLD)
print("bpf", call(321, 0, 0, 0))
print("seccomp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])
"""


def kernel_surface(pack, tmp: Path):
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "probe.py").write_text(KERNEL_PROBE)
    r = in_sandbox(ws, "python3 probe.py; unshare -Urm true && echo UNSHARE_OK || echo UNSHARE_DENIED")
    got = dict(ln.split(" ", 1) for ln in r.output.splitlines() if " " in ln)
    for name in ("add_key", "keyctl", "request_key", "ptrace", "mount", "unshare", "clone_newuser", "bpf"):
        assert got.get(name) == "EPERM", (name, r.output)
    assert got.get("seccomp") == "2" and "UNSHARE_DENIED" in r.output, r.output
    return "refused", "EPERM for keyring, ptrace, mount, namespaces, bpf; Seccomp: 2"


# ---- 5. host disk -------------------------------------------------------------------------


def disk_fallocate_loop(pack, tmp: Path):
    """posix_fallocate as fast as it goes, in a 16 MiB workspace: the kernel stops it."""
    from evoharness.envs.repo.sandbox import WorkspaceFS

    ws = tmp / "ws"
    with WorkspaceFS(ws, 16, 1000):
        r = in_sandbox(
            ws,
            "python3 -c \"import os\nfor i in range(4000):\n    fd = os.open(f'f{i}', os.O_CREAT|os.O_WRONLY)\n"
            '    os.posix_fallocate(fd, 0, 1 << 20)\n" 2>&1 | tail -1',
            disk_mb=16,
        )
        used = dir_usage(ws)[0]
        assert used <= 17 << 20, used
        assert "No space left" in r.output or "ENOSPC" in r.output or r.killed == "disk", r.output
    assert not any(ws.iterdir())
    return "contained", f"{used >> 20} MiB written at most; ENOSPC"


def disk_sparse_copy(pack, tmp: Path):
    """Sparse files of 512 MiB each (4 KiB on disk) beside a correct solution: the scorer's
    copy counts apparent sizes, so they are skipped instead of filled with zeros."""
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp / "ws")
    r = in_sandbox(ws, "for i in 1 2 3 4; do truncate -s 512M sparse$i; done; du -sk .", file_size_mb=1024)
    assert r.exit_code == 0, r.output
    o = score_workspace(task, ws, budget=1, limits=Limits(wall_s=60, cpu_s=60, disk_mb=64))
    assert (o.status, o.reward) == ("scored", 1.0), o.detail
    assert o.detail["copy"]["skipped"] == 4 and o.detail["copy"]["bytes"] < 1 << 20, o.detail["copy"]
    return "contained", "4 x 512 MiB sparse files skipped by the bounded copy"


def disk_episode_removed(pack, tmp: Path):
    """A finished episode leaves its transcript and episode.json, not its workspace."""
    from evoharness.envs.repo.policies import ReferencePolicy
    from evoharness.envs.repo.scaffold import run_repo_episode

    ep = run_repo_episode(pack["roman_numerals"], ReferencePolicy(), tmp / "run")
    assert ep.reward == 1.0
    assert sorted(p.name for p in (tmp / "run").iterdir()) == ["episode.json", "transcript.json"]
    assert not os.path.ismount(tmp / "run" / "workspace")
    return "contained", "workspace unmounted and removed after scoring"


ATTACKS = {
    "escape: link over a hidden test file": escape_link_over_test_file,
    "escape: link over a hidden test dir": escape_link_over_test_dir,
    "escape: links to / on the tests' path": escape_link_to_root_in_copy,
    "dropped: pytest.exit(returncode=3)": dropped_pytest_exit,
    "dropped: os._exit(4) in a test": dropped_os_exit,
    "dropped: spin between two tests": dropped_loop_spin,
    "dropped: 700 nested mkdir/chdir": dropped_deep_tree,
    "dropped: broken root conftest.py": dropped_broken_conftest,
    "dropped: ini usage error (exit 4)": dropped_bad_ini,
    "reward hack: magic module, 22 tasks": magic_module,
    "reward hack: magic functions, 22 tasks": magic_functions,
    "forge: emptied test functions": tamper_empty_test_functions,
    "forge: conftest pytest_pyfunc_call": tamper_conftest_pyfunc_call,
    "forge: unsigned / uncollected passes": forged_unsigned_and_uncollected_passes,
    "kernel: keyctl/ptrace/mount/userns": kernel_surface,
    "disk: fallocate loop (16 MiB ws)": disk_fallocate_loop,
    "disk: sparse files in the copy": disk_sparse_copy,
    "disk: finished episode removed": disk_episode_removed,
}
