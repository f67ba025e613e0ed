"""statepoold under systemd's protocols, run against the build's daemon.

- Type=notify: READY=1 arrives only once the daemon's socket accepts connections, and
  STOPPING=1 (with EXTEND_TIMEOUT_USEC covering the drain) when SIGTERM starts the drain.
- The probes /healthz and /readyz on the metrics listener follow the same states.
- Reload (SIGUSR2): a successor takes the pool over and becomes the main PID.
- Socket activation: a listening socket passed as systemd does it (systemd-socket-activate
  from Debian's systemd package) is served, left in place at exit, and one bound to
  another path than --socket is refused with a message.

Run by ctest (tests/deploy/CMakeLists.txt) with STATEPOOLD and STATEPOOLCTL set.
"""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

DAEMON = os.environ["STATEPOOLD"]
CTL = os.environ["STATEPOOLCTL"]
DRAIN_TIMEOUT_S = 3
STOP_MARGIN_S = 30  # Server::kStopMargin


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path):
    """(status, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class NotifyListener:
    """The service manager's end of NOTIFY_SOCKET: a datagram socket in `directory`."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.store = []

    def receive(self, timeout):
        """The next notification that is not about the descriptor store, as a dict of its
        assignments. Store messages (the crash journal's: FDSTORE=1, FDSTOREREMOVE=1) are
        kept in self.store, a list of (assignments, [fds, closed]) in arrival order."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            data, fds, _, _ = socket.recv_fds(self.sock, 4096, 16)
            for fd in fds:
                os.close(fd)
            fields = dict(line.split("=", 1) for line in data.decode().splitlines()
                          if "=" in line)
            if "FDSTORE" in fields or "FDSTOREREMOVE" in fields:
                self.store.append((fields, len(fds)))
                continue
            return fields

    def collect(self, timeout):
        """Reads the store messages that remain, until none comes for `timeout` seconds."""
        try:
            while True:
                self.receive(timeout)
        except TimeoutError:
            pass

    def close(self):
        self.sock.close()


def daemon_args(sock, metrics_port):
    return [DAEMON, "--socket", sock, "--metrics-address", f"127.0.0.1:{metrics_port}",
            "--api-address", "off", "--pool-capacity", "64MiB", "--workers", "1",
            "--drain-timeout", f"{DRAIN_TIMEOUT_S}s", "--io-timeout", "2s"]


def ping(sock):
    return subprocess.run([CTL, "--socket", sock, "ping"], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def workdir():
    directory = tempfile.mkdtemp(prefix="statepool-systemd-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_ready_once_listening_and_stopping_when_draining(workdir):
    listener = NotifyListener(workdir)
    sock = os.path.join(workdir, "statepool.sock")
    port = free_port()
    env = dict(os.environ, NOTIFY_SOCKET=listener.path)
    daemon = subprocess.Popen(daemon_args(sock, port), env=env, stderr=subprocess.PIPE,
                              text=True)
    try:
        ready = listener.receive(timeout=60)
        assert ready.get("READY") == "1", ready
        assert ready.get("STATUS") == f"serving {sock}", ready
        # The moment READY=1 arrives, a connect() succeeds: no retry loop.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(sock)
        assert ping(sock).returncode == 0
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/readyz") == (200, "ready\n")

        # A connection with half a frame header keeps the drain busy until --io-timeout.
        busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        busy.connect(sock)
        busy.sendall(b"\x00\x01\x02")
        daemon.send_signal(signal.SIGTERM)
        stopping = listener.receive(timeout=30)
        assert stopping.get("STOPPING") == "1", stopping
        assert stopping.get("STATUS") == "draining (SIGTERM)", stopping
        assert int(stopping["EXTEND_TIMEOUT_USEC"]) == (DRAIN_TIMEOUT_S + STOP_MARGIN_S) * 10**6
        # Draining: not ready, still alive; the metrics listener serves until the exit.
        # (This connection came in just before SIGTERM: before the drain took the accept
        # loop's pending connection in, it was reset here, and the drain ended at once.)
        assert http_get(port, "/readyz") == (503, "draining\n")
        assert http_get(port, "/healthz") == (200, "ok\n")
        busy.close()
        assert daemon.wait(timeout=60) == 0, daemon.stderr.read()
        assert not os.path.exists(sock)  # the daemon's own socket file is removed
        # The crash journal went into the descriptor store with its memfd, and the clean
        # stop took it out again: nothing is left to recover.
        listener.collect(timeout=0.5)
        stored = [(f["FDNAME"], fds) for f, fds in listener.store if f.get("FDSTORE") == "1"]
        removed = [f["FDNAME"] for f, _ in listener.store if f.get("FDSTOREREMOVE") == "1"]
        assert ("statepool-journal-0", 1) in stored, listener.store
        assert removed and removed[-1] == "statepool-journal-0", listener.store
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        listener.close()


def test_reload_hands_the_pool_and_the_main_pid_to_a_successor(workdir):
    """ExecReload= sends SIGUSR2: the daemon starts the installed binary with --take-over,
    hands the pool over, tells systemd MAINPID= of the successor (waiting until systemd
    has it: sd_notify_barrier) and exits 0; the successor says READY=1 and serves."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0  # to reap the successor
    listener = NotifyListener(workdir)
    sock = os.path.join(workdir, "statepool.sock")
    env = dict(os.environ, NOTIFY_SOCKET=listener.path)
    log = open(os.path.join(workdir, "daemon.log"), "w+")
    daemon = subprocess.Popen(daemon_args(sock, free_port()), env=env, stderr=log)
    successor = None
    try:
        assert listener.receive(timeout=60).get("READY") == "1"
        daemon.send_signal(signal.SIGUSR2)
        main_pid = None
        while True:
            message = listener.receive(timeout=60)
            if "MAINPID" in message:
                main_pid = int(message["MAINPID"])
            if message.get("READY") == "1":
                break
        assert main_pid is not None and main_pid != daemon.pid
        successor = main_pid
        assert daemon.wait(timeout=60) == 0
        assert ping(sock).returncode == 0
        log.seek(0)
        text = log.read()
        assert "SIGUSR2: started the successor" in text, text
        assert f"(pid {successor})" in text, text
        assert "took over generation 0's pool" in text, text
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if successor is not None:
            os.kill(successor, signal.SIGTERM)
            _, status = os.waitpid(successor, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        listener.close()
        log.close()


def test_probes_refuse_other_methods_and_need_no_token(workdir):
    sock = os.path.join(workdir, "statepool.sock")
    token_file = os.path.join(workdir, "token")
    with open(token_file, "w") as f:
        f.write("s3cret-token-for-the-test\n")
    os.chmod(token_file, 0o600)
    api_port = free_port()
    args = daemon_args(sock, "0")
    args[args.index("--api-address") + 1] = f"127.0.0.1:{api_port}"
    args += ["--api-token-file", token_file]
    daemon = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while ping(sock).returncode != 0:
            assert time.monotonic() < deadline, "the daemon did not come up"
            time.sleep(0.1)
        # The API wants its token; its probes do not.
        assert http_get(api_port, "/v1")[0] == 401
        assert http_get(api_port, "/readyz") == (200, "ready\n")
        request = urllib.request.Request(f"http://127.0.0.1:{api_port}/healthz", method="POST",
                                         data=b"x")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 405
        assert refused.value.headers["Allow"] == "GET, HEAD"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)


def activated(workdir, listen_path, daemon_socket):
    """The daemon under systemd-socket-activate, which listens on `listen_path` and
    starts the daemon (passing the socket as LISTEN_FDS) at the first connection, which
    this makes."""
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        pytest.skip("systemd-socket-activate is not installed (Debian package systemd)")
    log = open(os.path.join(workdir, "daemon.log"), "w+")
    process = subprocess.Popen([activate, "-l", listen_path, *daemon_args(daemon_socket, "0")],
                               stderr=log)
    # The socket file exists from bind(), before listen(): wait for a connect to succeed.
    # That first connection starts the daemon (it finds the connection closed).
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, "systemd-socket-activate exited"
        assert time.monotonic() < deadline, "systemd-socket-activate did not listen"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(listen_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                pass
        time.sleep(0.05)
    return process, log


def test_serves_the_socket_systemd_passes(workdir):
    sock = os.path.join(workdir, "statepool.sock")
    daemon, log = activated(workdir, sock, sock)
    try:
        # Connections wait in the socket's backlog until the daemon serves them.
        result = ping(sock)
        assert result.returncode == 0, result.stderr
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        log.seek(0)
        text = log.read()
        assert f"serving the socket systemd passed for {sock}" in text, text
        assert "removing stale socket" not in text
        # The socket belongs to the socket unit: the daemon leaves it for the next start.
        assert os.path.exists(sock)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()


def test_refuses_a_passed_socket_bound_elsewhere(workdir):
    passed = os.path.join(workdir, "unit.sock")
    configured = os.path.join(workdir, "statepool.sock")
    daemon, log = activated(workdir, passed, configured)
    try:
        assert daemon.wait(timeout=60) == 1
        log.seek(0)
        text = log.read()
        assert f"not a listening Unix stream socket bound to {configured}" in text, text
        assert "ListenStream=" in text
        assert not os.path.exists(configured)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()


def test_reload_under_socket_activation_leaves_the_socket_units_socket(workdir):
    """A successor serves the socket unit's socket it was handed, and leaves its file in
    place at exit, as the daemon that systemd passed it to does."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    sock = os.path.join(workdir, "statepool.sock")
    daemon, log = activated(workdir, sock, sock)
    successor = None
    try:
        assert ping(sock).returncode == 0
        daemon.send_signal(signal.SIGUSR2)
        assert daemon.wait(timeout=60) == 0
        log.seek(0)
        text = log.read()
        marker = "SIGUSR2: started the successor "
        assert marker in text, text
        successor = int(text[text.index("(pid ", text.index(marker)) + 5:].split(")")[0])
        assert ping(sock).returncode == 0
        os.kill(successor, signal.SIGTERM)
        _, status = os.waitpid(successor, 0)
        successor = None
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(sock)  # the socket unit's: left for the next start
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if successor is not None:
            os.kill(successor, signal.SIGKILL)
            os.waitpid(successor, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        log.close()
