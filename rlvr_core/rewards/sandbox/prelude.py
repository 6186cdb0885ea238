"""The in-process sandbox's prelude: not imported, but read as text and run by the child with ``python -c``.

It runs before the program: the limits, then the audit hook, then the program's code as ``__main__``.
argv: [-c, workdir, cpu_seconds, "RLIMIT_X=value,...", program_path]. ``inprocess._prelude()`` reads this
file and passes its text unchanged, so it must run on its own, with the standard library only.
"""

import os as _os
import resource as _resource
import sys as _sys

if __name__ != "__main__":
    raise ImportError("rlvr_core.rewards.sandbox.prelude is the sandbox child's prelude, run with `python -c`; "
                      "it sets resource limits and runs a program, so it is never imported")

_root, _cpu, _limits, _prog = _sys.argv[1:5]
with open(_prog, "rb") as _f:
    _src = _f.read()
for _item in _limits.split(","):
    _name, _value = _item.split("=")
    _resource.setrlimit(getattr(_resource, _name), (int(_value), int(_value)))
_resource.setrlimit(_resource.RLIMIT_CPU, (int(_cpu), int(_cpu) + 1))

# Everything the hook uses is bound in the factories below (closure cells, not globals), so the program
# cannot change it by patching builtins or stdlib modules; path resolution uses only C functions.


def _tables():
    # events that end the program, imports that end it, and
    # event -> (indices of path arguments that must stay inside root, indices of dir_fd arguments)
    _DENY = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
        "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
        "signal.pthread_kill", "os.setuid", "os.setgid", "os.chroot", "os.mknod",
        "os.setns", "os.unshare", "socket.__new__", "socket.connect", "socket.bind",
        "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.socketpair",
        "resource.setrlimit", "resource.prlimit", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.cdata", "ctypes.call_function", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "sys.remote_exec",
    })
    _DENY_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
    _PATH_EVENTS = {
        "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
        "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)), "os.symlink": ((1,), (2,)),
        "os.truncate": ((0,), ()), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
        "os.utime": ((0,), (3,)), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
        "os.lchmod": ((0,), ()), "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
        "os.mkfifo": ((0,), (2,)), "shutil.rmtree": ((0,), ()),
    }
    return _DENY, _DENY_IMPORTS, _PATH_EVENTS


def _make_die():
    _write, _exit, _str = _os.write, _os._exit, str

    def die(event, detail=""):
        try:
            _write(2, b"\n[sandbox] blocked: " + _str(event).encode() + b" " + _str(detail)[:200].encode() + b"\n")
        finally:
            _exit(86)

    return die


def _make_real(die):
    _lstat, _readlink, _getcwd = _os.lstat, _os.readlink, _os.getcwd

    def real(p):
        # realpath from C primitives only: absolute, '.', '..' and symlinks resolved
        if not p.startswith("/"):
            p = _getcwd() + "/" + p
        pending = [c for c in p.split("/") if c][::-1]
        out = []
        hops = 0
        while pending:
            c = pending.pop()
            if c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = "/" + "/".join(out + [c])
            try:
                mode = _lstat(cand).st_mode
            except OSError:
                out.append(c)
                continue
            if mode & 0o170000 == 0o120000:
                hops += 1
                if hops > 40:
                    die("symlink loop", cand)
                target = _readlink(cand)
                if target.startswith("/"):
                    out = []
                pending.extend([x for x in target.split("/") if x][::-1])
            else:
                out.append(c)
        return "/" + "/".join(out)

    return real


def _make_paths(root, pid, die):
    _stat = _os.stat
    _type, _issubclass, _str, _bytes = type, issubclass, str, bytes
    _copy = _str.__getitem__
    _decode = _bytes.decode
    _ALL = slice(None)
    _PREFIX = root + "/"

    def text(p):
        t = _type(p)
        if t is _str or _issubclass(t, _str):
            return _copy(p, _ALL)  # an exact str with the same characters
        if t is _bytes or _issubclass(t, _bytes):
            return _decode(_bytes(p), "utf-8", "surrogateescape")
        die("path that is not str or bytes", t.__name__)

    def inside(p):
        return p == root or p.startswith(_PREFIX)

    def other_proc(p):
        if not p.startswith("/proc/"):
            return False
        head = p[6:].split("/", 1)[0]
        return head.isdigit() and head != pid

    def is_dir(p):
        try:
            return _stat(p).st_mode & 0o170000 == 0o040000
        except OSError:
            return False

    return text, inside, other_proc, is_dir


def _make_check(die, real, paths, tables):
    text, inside, other_proc, is_dir = paths
    _DENY, _DENY_IMPORTS, _PATH_EVENTS = tables
    _type, _len, _str = type, len, str
    _WFLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
    _NO_DIR_FD = (None, -1, -100)

    def check(event, args):
        if event in _DENY:
            die(event)
        if event == "import":
            name = args[0]
            if _type(name) is _str and name.split(".")[0] in _DENY_IMPORTS:
                die(event, name)
            return
        if event == "open":
            path, mode, flags = args
            if _type(path) is int:
                return
            where = real(text(path))
            writing = bool(flags & _WFLAGS) or (
                mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if writing and not inside(where):
                die("open for writing outside the sandbox directory", where)
            if other_proc(where):
                die("open of another process's /proc entry", where)
            if mode is None and not inside(where) and is_dir(where):
                die("os.open of a directory outside the sandbox directory", where)
            return
        spec = _PATH_EVENTS.get(event)
        if spec is not None:
            paths, dir_fds = spec
            for i in dir_fds:
                if i < _len(args) and args[i] not in _NO_DIR_FD:
                    die(event, "dir_fd")
            for i in paths:
                if i < _len(args):
                    if _type(args[i]) is int:
                        die(event, "file descriptor")
                    if not inside(real(text(args[i]))):
                        die(event, args[i])

    return check


def _make_hook(die, check):
    _type, _BaseException = type, BaseException
    busy = [False]

    def hook(event, args):
        if busy[0]:
            return
        busy[0] = True
        try:
            check(event, args)
        except _BaseException as e:  # never let the program see a traceback through the hook
            die("sandbox check failed on " + event, _type(e).__name__)
        finally:
            busy[0] = False

    return hook


_die = _make_die()
_paths = _make_paths(_os.path.realpath(_root), str(_os.getpid()), _die)
_sys.addaudithook(_make_hook(_die, _make_check(_die, _make_real(_die), _paths, _tables())))
del _tables, _make_die, _make_real, _make_paths, _make_check, _make_hook, _die, _paths
del _root, _cpu, _limits, _prog, _item, _name, _value, _f
_sys.argv = ["main.py"]
_code = compile(_src, "main.py", "exec")
del _src
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__, "__file__": "main.py"})
