"""The tests' warm start for main.py and tools/*.py (conftest.run_main, conftest.run_tool): this process imports torch
and torchvision once (seconds on every start: torchvision's ops import torch._dynamo), then forks a child for each
run it is sent, which runs ``python script.py ...`` or ``python -m module ...`` as the interpreter does (the script's
folder or the working folder first on sys.path, its argv, environment, working folder, its
output in the files named, the interpreter's own exit: atexit, threads, an uncaught exception's traceback and exit
code 1). It runs no torch op itself, so no thread runs when it forks, and it imports nothing of the project: each run
imports the project fresh, in its own order.

Requests and replies are JSON lines on its stdin and stdout: {"argv", "env", "cwd", "stdout", "stderr"} (argv:
what follows ``python``) is answered with {"pid"} at once and {"status"} (the exit code, or minus the signal that
ended the child) at its end. It ends when its stdin does. Standard library only, and Python 3.7's."""
import io
import json
import os
import sys


def reply(out, message):
    out.write(json.dumps(message) + "\n")
    out.flush()


def exit_code(status):
    """The exit code subprocess reports for a waitpid status."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def device_backends():
    """The device extensions torch >= 2.5 imports with itself (entry points of the group ``torch.backends``, what
    torch_npu's wheel installs): main.py turns that off for a CPU run before it imports torch."""
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7: torch 1.11 loads none
        return []
    found = metadata.entry_points()
    found = found.select(group="torch.backends") if hasattr(found, "select") else found.get("torch.backends", [])
    return sorted(point.name for point in found)


def serve():
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    backends = device_backends()
    if backends and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ:  # main.py decides it before torch loads them
        reply(replies, {"ready": False, "why": "torch would load {} with itself".format(", ".join(backends))})
        return None
    import torch  # noqa: F401  (what every run imports)
    import torchvision  # noqa: F401
    reply(replies, {"ready": True})
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return request
        reply(replies, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        reply(replies, {"status": exit_code(status)})
    return None


def run(request):
    """In the forked child: the script as its own process would run it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    buffered = not os.environ.get("PYTHONUNBUFFERED")  # the streams as the interpreter makes them for a file
    for name, fd, errors in (("stdout", 1, getattr(sys, "__stdout__").errors), ("stderr", 2, "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw) if buffered else raw,
                                            encoding=getattr(sys, "__" + name + "__").encoding, errors=errors,
                                            line_buffering=buffered and fd == 2, write_through=not buffered))
    import runpy
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]  # run_module puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    todo = serve()
    if todo is not None:
        run(todo)
