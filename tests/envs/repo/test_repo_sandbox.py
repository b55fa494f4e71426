"""The sandbox contains what an agent might do: each attack runs for real in bwrap and the
host is checked afterwards."""

from __future__ import annotations

import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evoharness.envs.repo import sandbox as sandbox_mod
from evoharness.envs.repo.sandbox import Limits, Sandbox, SandboxUnavailable, _proc_uid_stats
from evoharness.envs.repo.task import PACK_DIR


def test_confined_view_of_the_system(sandbox):
    r = sandbox.run(
        "id -u; pwd; python -c 'import pytest; print(pytest.__version__)'; "
        "ls /root/.ssh /work /home /etc/shadow 2>&1; touch /usr/x 2>&1; echo done"
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == str(sandbox.uid) and int(lines[0]) != 0 and lines[1] == "/workspace"
    assert "Read-only file system" in r.output and "No such file" in r.output and lines[-1] == "done"


def test_hidden_tests_and_project_invisible(sandbox, pack):
    task = next(iter(pack.values()))
    test_file = next(task.tests_dir.glob("test_*.py"))
    r = sandbox.run(
        f"cat {test_file} 2>&1; ls {PACK_DIR} 2>&1; ls {task.root} 2>&1; python -c 'import evoharness' 2>&1 | tail -1"
    )
    assert "def test_" not in r.output
    assert r.output.count("No such file or directory") >= 3 and "ModuleNotFoundError" in r.output


def test_writes_outside_the_workspace_never_reach_the_host(sandbox, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    r = sandbox.run(
        f"echo x > {outside}/pwned; echo x > /tmp/t && echo tmp-ok; echo x > /workspace/../escape; "
        "echo x > /workspace/inside && echo ws-ok"
    )
    assert "tmp-ok" in r.output and "ws-ok" in r.output
    assert not (outside / "pwned").exists() and (sandbox.workspace / "inside").read_text() == "x\n"
    assert not (sandbox.workspace.parent / "escape").exists()


def test_no_network_even_to_host_loopback(sandbox):
    hits = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        r = sandbox.run(
            f"python -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/x', timeout=3)\"; "
            "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\""
        )
        assert "Connection refused" in r.output and "Network is unreachable" in r.output
        assert hits == []
    finally:
        srv.shutdown()


def test_fork_bomb_is_contained(sandbox):
    t0 = time.monotonic()
    r = sandbox.run(":(){ :|:& };:; sleep 30", wall_s=4)
    assert r.killed == "wall_time" and time.monotonic() - t0 < 15
    assert _proc_uid_stats(sandbox.uid)[0] == []  # every process of the bomb is gone
    assert sandbox.run("echo alive").output.strip() == "alive"


def test_memory_bomb_is_contained(sandbox):
    r = sandbox.run("python -c 'x = bytearray(4 << 30)'")
    assert r.exit_code != 0 and "MemoryError" in r.output
    # many processes, each under the per-process cap, together over it: the watchdog ends them
    r = sandbox.run(
        "for i in 1 2 3 4; do python -c 'import time; x = bytearray(600 << 20); "
        'x[::4096] = b"1" * len(x[::4096]); time.sleep(30)\' & done; wait',
        wall_s=15,
    )
    assert r.killed == "memory"
    assert _proc_uid_stats(sandbox.uid)[0] == []


def test_infinite_loop_and_background_processes_killed(sandbox):
    t0 = time.monotonic()
    r = sandbox.run("(sleep 1000 &) ; while true; do :; done", wall_s=2)
    assert r.timed_out and r.exit_code == -9 and time.monotonic() - t0 < 10
    r = sandbox.run("sleep 1000 &")  # a background process does not outlive its command
    assert r.exit_code == 0 and _proc_uid_stats(sandbox.uid)[0] == []


def test_100mb_of_output_is_bounded(sandbox):
    r = sandbox.run("head -c 100000000 /dev/zero | tr '\\0' 'a'; echo END", wall_s=30)
    assert r.output_total >= 100_000_000
    assert len(r.output) < 2 * sandbox.limits.output_bytes
    assert "bytes of output truncated" in r.output and r.output.rstrip().endswith("END")


def test_file_size_and_cpu_limits(sandbox):
    r = sandbox.run("head -c 200M /dev/zero > big; stat -c %s big", file_size_mb=8)
    assert "File size limit exceeded" in r.output and r.output.split()[-1] == str(8 << 20)
    r = sandbox.run("python -c 'while True: pass'", cpu_s=1, wall_s=20)
    assert r.killed is None and r.exit_code != 0  # SIGXCPU from RLIMIT_CPU, not the wall timer


def test_missing_bwrap_fails_loudly(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        Sandbox(tmp_path / "ws")


def test_missing_seccomp_library_fails_loudly(tmp_path, monkeypatch):
    """Without libseccomp's bindings no filter can be built: the sandbox refuses to start
    rather than run agent commands unfiltered."""
    import sys

    monkeypatch.setattr(sandbox_mod, "_SECCOMP", None)
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if not installed
    with pytest.raises(SandboxUnavailable, match="seccomp"):
        Sandbox(tmp_path / "ws")


def test_seccomp_filter_is_built_and_loaded(sandbox):
    assert len(sandbox_mod.seccomp_program()) % 8 == 0
    assert sandbox.run("grep '^Seccomp:' /proc/self/status").output.split() == ["Seccomp:", "2"]


def test_bwrap_is_installed():
    """CI installs bubblewrap (.ci/run); without it the environment must not pretend."""
    assert shutil.which("bwrap"), "bubblewrap missing: apt-get install -y bubblewrap"


def test_package_data_stays_covered_inside_a_mounted_install(tmp_path):
    """Installed as a wheel, the pack sits inside the read-only site-packages: it is covered."""
    src = PACK_DIR.parents[2]  # the directory holding the evoharness package
    with Sandbox(tmp_path / "ws", ro_binds={str(src): "/opt/site"}) as sb:
        r = sb.run("ls /opt/site; echo ---; ls -A /opt/site/evoharness | wc -l")
    listed, count = r.output.split("---")
    assert "evoharness" in listed.split() and count.strip() == "0"


def test_many_empty_files_are_bounded_and_can_be_cleaned_up(sandbox):
    """Empty files take no blocks, so only a count of entries stops inode exhaustion."""
    r = sandbox.run("python -c \"[open(f'f{i}', 'w').close() for i in range(10**6)]\"", wall_s=30, max_files=2000)
    n = sum(1 for _ in sandbox.workspace.iterdir())
    # the watchdog polls, so how far past the bound a fast writer gets depends on the machine's speed
    # (27,605 seen on a quiet box): assert it was stopped long before its million, not a timing
    assert r.killed == "files" and 2000 < n < 200_000, (r.killed, n)
    # found past the bound, a command may only shrink the workspace: growth ends it at once
    r = sandbox.run("touch more1 more2 more3; sleep 5", max_files=2000)
    assert r.killed == "files" and r.wall_s < 3 and sum(1 for _ in sandbox.workspace.iterdir()) <= n + 3
    r = sandbox.run("head -c 1000 /dev/zero > f1; echo $?", max_files=2000)  # no file may grow either
    assert (sandbox.workspace / "f1").stat().st_size == 0
    r = sandbox.run("rm -f f* more*; ls | wc -l", max_files=2000)
    assert r.killed is None and r.output.strip() == "0"


def test_data_nested_past_path_max_is_counted(sandbox):
    """Below PATH_MAX a walk by path fails and sees nothing; the watchdog walks by fd."""
    r = sandbox.run(
        "python -c \"import os\nfor i in range(20):\n    os.mkdir('d' * 250); os.chdir('d' * 250)\n"
        "for i in range(5):\n    open(f'big{i}', 'wb').write(b'1' * (8 << 20))\nimport time; time.sleep(5)\"",
        disk_mb=16,
        wall_s=20,
    )
    assert r.killed == "disk" and r.wall_s < 5, (r.killed, r.output)
    assert sandbox_mod.dir_usage(sandbox.workspace)[0] > 16 << 20


def test_memory_no_process_maps_is_bounded_by_the_sandbox_cgroup(sandbox):
    """SysV shared memory after shmdt and memfd files show in no process's RSS and escape
    RLIMIT_AS: only the sandbox's memory cgroup bounds them (600 MB asked, 256 MB allowed)."""
    if not sandbox.privileged or sandbox_mod.MemoryCgroup.parent() is None:
        pytest.skip("no memory cgroup can be made here: only the RSS watchdog bounds memory")
    shm = (
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "for i in range(6):\n    sid = libc.shmget(0, 100 << 20, 0o1600)\n    a = libc.shmat(sid, None, 0)\n"
        "    ctypes.memset(a, 1, 100 << 20)\n    libc.shmdt(ctypes.c_void_p(a))\n    print('segment', i, flush=True)\n"
    )
    memfd = (
        "import os\nfds = []\nfor i in range(10):\n    fd = os.memfd_create('x')\n"
        "    [os.write(fd, b'1' * (1 << 20)) for _ in range(60)]\n    fds.append(fd)\n"
        "    print('memfd', i, flush=True)\n"
    )
    for code in (shm, memfd):
        r = sandbox.run(["python", "-c", code], memory_mb=256, wall_s=20)
        assert r.killed == "memory" and r.output.count("\n") < 5, (r.killed, r.output)
    assert sandbox.run("echo alive").output.strip() == "alive"
    leftover = [
        p for p in sandbox_mod.MemoryCgroup.parent()[0].iterdir() if p.name.startswith(f"evo-sbx-{sandbox.uid}-")
    ]
    assert leftover == []


def test_no_host_secrets_abstract_sockets_or_shared_memory(sandbox, monkeypatch):
    """The host's environment (API keys) never enters; an abstract unix socket the host
    listens on is out of reach (own network namespace); /dev/shm is not writable; host
    processes are invisible."""
    import os
    import socket

    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    name = f"\0evo-test-{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(1)
    try:
        connect = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\\\0{name[1:]}')"
        r = sandbox.run(f"""env; python -c "{connect}" 2>&1 | tail -1;
                        echo x > /dev/shm/x 2>&1; ls /proc | grep -c '^[0-9]'""")
    finally:
        srv.close()
    assert "sk-host-secret" not in r.output and "OPENAI" not in r.output
    assert "ConnectionRefusedError" in r.output and "/dev/shm/x: Permission denied" in r.output
    assert int(r.output.split()[-1]) < 10  # only the sandbox's own few processes


def test_read_only_binds_under_the_hosts_tmp_stay_visible(tmp_path):
    """The sandbox's /tmp is a fresh tmpfs; a host directory under /tmp (a CI checkout's venv,
    here a tool directory) bound read-only must land on top of it, not vanish beneath it."""
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "hello.txt").write_text("hi from the host\n")
    assert str(tool).startswith("/tmp/")
    sb = Sandbox(tmp_path / "ws", limits=Limits(wall_s=20, cpu_s=20), ro_binds={str(tool): str(tool)})
    try:
        r = sb.run(f"cat {tool}/hello.txt; touch {tool}/x 2>&1; touch /tmp/scratch && echo tmp-writable")
    finally:
        sb.close()
    assert "hi from the host" in r.output and "Read-only file system" in r.output and "tmp-writable" in r.output
    assert not (tool / "x").exists()
