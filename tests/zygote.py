"""A fork server for the lanes test: one process imports the kit (torch, transformers, peft and the stage
scripts' modules) once, then forks a child per `chorus_mini.py ...` call, which runs it as
tests/chorus_in_process.py does. Each call so pays a fork instead of an interpreter start-up and seconds of
imports on 2 cores (bench/gpu/run_small.sh starts ~28 of them).

    python tests/zygote.py serve SOCKET                 # imports, then serves until killed
    python tests/zygote.py call SOCKET chorus_mini.py ARGS...   # what the test's PYTHON wrapper runs

`call` is light (no kit imports): it hands the server its working folder, argv, environment and its stdin /
stdout / stderr (SCM_RIGHTS), waits for the child's exit code and exits with it. A child that dies without
one (a signal) gives exit 1.
"""
import json
import os
import signal
import socket
import struct
import sys


def call(path, argv):
    payload = json.dumps({"cwd": os.getcwd(), "argv": argv, "env": dict(os.environ)}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        socket.send_fds(s, [struct.pack("!Q", len(payload))], [0, 1, 2])
        s.sendall(payload)
        reply = b""
        while len(reply) < 4:
            chunk = s.recv(4 - len(reply))
            if not chunk:
                return 1
            reply += chunk
    return struct.unpack("!i", reply)[0]


def _recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _child(conn):
    """In the forked child: take the client's stdio, folder and environment, run the call, reply."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)       # the stage scripts wait for their own children
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    head += _recv_exact(conn, 8 - len(head))
    req = json.loads(_recv_exact(conn, struct.unpack("!Q", head)[0]))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    code = 1
    try:
        import chorus_in_process
        code = chorus_in_process.run(req["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        conn.sendall(struct.pack("!i", code))
        os._exit(code)


def serve(path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chorus_in_process            # noqa: F401  the kit, chorus_mini and the in-process runner
    import common
    import distill                      # noqa: F401  the stage scripts' modules (runpy reuses them)
    import evaluate                     # noqa: F401
    import merge                        # noqa: F401
    import rl                           # noqa: F401
    import sft                          # noqa: F401
    common.tiny_model(seed=0)           # transformers imports its model classes on first use
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # finished children are reaped by the kernel
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen(64)
        print(f"zygote: serving on {path}", flush=True)
        while True:
            conn, _ = srv.accept()
            if os.fork() == 0:
                srv.close()
                _child(conn)
            conn.close()


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "call":
        sys.exit(call(sys.argv[2], sys.argv[3:]))
    else:
        sys.exit("usage: python tests/zygote.py serve SOCKET | call SOCKET chorus_mini.py ARGS...")
