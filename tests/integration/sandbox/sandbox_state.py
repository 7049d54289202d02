"""Programs for the fresh-state tests: a victim that describes the sandbox it finds, and attackers.

``VICTIM`` prints one JSON object describing everything an earlier execution could have left
behind or changed: files in every place it can write and in the system folders, what ``/bin/sh``
and ``bash`` print, SysV IPC objects and POSIX message queues (by the names the attackers use and,
where listed, all of them), keyrings, sockets, processes, hostname, environment and limits, and
whether it can use the memory and the ``/tmp`` and ``/dev/shm`` space its limits promise. On a
brand-new pool and after any attacker, it must print the same.

:func:`random_attacker` builds attacker programs from a seeded generator: writes anywhere
writable, IPC objects, permission tricks, symlink swaps, sockets and leftover processes.
"""

from __future__ import annotations

import random

SYSV_KEYS = [0x5A5A0000 + i for i in range(4)]
MQ_NAMES = [f"/agentrl-q{i}" for i in range(4)]

# The victim: {"memory_mb": ..., "fill_mb": ...} are substituted by the test (its limits).
VICTIM = r'''
import ctypes, json, os, resource, socket, stat, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
state = {}

def walk(top, limit=200):
    found = []
    for root, dirs, files in os.walk(top, onerror=lambda e: found.append(("error", e.filename, e.errno))):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                found.append((path, stat.filemode(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0))
            except OSError as e:
                found.append((path, "error", e.errno))
        if len(found) > limit:
            break
    return found[:limit]

for top in ("/tmp", "/dev/shm", "/dev/mqueue", "/var/tmp", "/run", "/opt", "/etc/ld.so.preload"):
    state["walk " + top] = walk(top) if os.path.isdir(top) else os.path.exists(top)
state["root"] = sorted((n, stat.filemode(os.lstat("/" + n).st_mode)) for n in os.listdir("/"))
state["links"] = {p: os.readlink(p) if os.path.islink(p) else "not a link" for p in ("/bin", "/lib", "/sbin", "/lib64")}
state["dev"] = sorted(os.listdir("/dev"))
state["shell"] = subprocess.run("echo shell-ok; ls /bin/ls", shell=True, capture_output=True, text=True).stdout
state["bash"] = subprocess.run(["bash", "-c", "echo $((6 * 7)); type ls"], capture_output=True, text=True).stdout
state["python"] = subprocess.run([sys.executable, "-c", "print('child-ok')"], capture_output=True, text=True).stdout

def errno_of(ret):
    return "found" if ret >= 0 else os.strerror(ctypes.get_errno())

state["shm"] = [errno_of(libc.shmget(k, 0, 0)) for k in SYSV_KEYS]
state["sem"] = [errno_of(libc.semget(k, 0, 0)) for k in SYSV_KEYS]
state["msg"] = [errno_of(libc.msgget(k, 0)) for k in SYSV_KEYS]
state["sysvipc"] = {k: len(open(f"/proc/sysvipc/{k}").read().splitlines()) - 1 for k in ("shm", "sem", "msg")}
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
state["mq"] = [errno_of(rt.mq_open(name.encode(), os.O_RDONLY)) for name in MQ_NAMES]
libc.syscall.restype = ctypes.c_long
state["keyring"] = errno_of(libc.syscall(KEYCTL_NR, 0, -4, 0))  # KEYCTL_GET_KEYRING_ID of the user keyring
state["sockets"] = {n: len(open(f"/proc/net/{n}").read().splitlines()) - 1
                    for n in ("tcp", "tcp6", "udp", "udp6", "unix")}
state["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
state["hostname"] = socket.gethostname()
state["environ"] = sorted(os.environ)
state["cwd"] = (os.getcwd(), sorted(os.listdir(".")))
state["rlimits"] = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")}
for where in ("/tmp", "/dev/shm"):
    try:
        with open(f"{where}/victim-fill", "wb") as f:
            for _ in range(FILL_MB):
                f.write(b"v" * (1 << 20))
        state["fill " + where] = "ok"
    except OSError as e:
        state["fill " + where] = os.strerror(e.errno)
    finally:
        if os.path.exists(f"{where}/victim-fill"):
            os.unlink(f"{where}/victim-fill")
try:
    block = bytearray(MEMORY_MB << 20)
    block[::4096] = b"m" * len(block[::4096])
    state["memory"] = "ok"
    del block
except MemoryError:
    state["memory"] = "MemoryError"
print(json.dumps(state, sort_keys=True))
'''


def victim(*, memory_mb: int, fill_mb: int, keyctl_nr: int) -> str:
    """The victim program for a sandbox whose limits allow ``memory_mb`` of allocation and
    ``fill_mb`` in each of ``/tmp`` and ``/dev/shm``."""
    return (f"SYSV_KEYS = {SYSV_KEYS!r}\nMQ_NAMES = {MQ_NAMES!r}\nMEMORY_MB = {memory_mb}\nFILL_MB = {fill_mb}\n"
            f"KEYCTL_NR = {keyctl_nr}\n" + VICTIM)


# --------------------------------------------------------------------------- attackers

PRELUDE = r'''
import ctypes, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
done = []
def attempt(label, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
        done.append(label)
    except BaseException:
        pass
def writable_dirs():
    out = []
    for top in ("/", "/tmp", "/dev", "/dev/shm", "/dev/mqueue", "/var", "/run", "/opt", "/etc", "/usr/local"):
        for root, dirs, files in os.walk(top):
            if root.startswith(("/proc", "/sys")):
                dirs[:] = []
                continue
            if os.access(root, os.W_OK):
                out.append(root)
            if root.count("/") > 3:
                dirs[:] = []
    return sorted(set(out))
def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
def fill(path, mb):
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(b"x" * (1 << 20))
def shm(key, size):
    ident = libc.shmget(key, size, 0o1000 | 0o666)
    assert ident >= 0
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(ident, None, 0)
    ctypes.memset(addr, 0x41, size)
def mq(name):
    rt.mq_open.restype = ctypes.c_int
    assert rt.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
'''

ACTIONS = {
    "write_everywhere": 'for d in writable_dirs():\n    attempt("w " + d, write, os.path.join(d, "left-{n}"), b"secret")\n',
    "replace_bin": 'attempt("rm /bin", os.unlink, "/bin")\nattempt("mkdir /bin", os.mkdir, "/bin")\n'
                   'attempt("fake sh", write, "/bin/sh", b"#!/usr/bin/python3\\nprint(\'forged\')\\n")\n',
    "ld_preload": 'attempt("preload", write, "/etc/ld.so.preload", b"/tmp/evil.so\\n")\n',
    "root_files": 'for p in ("/leak", "/opt/leak", "/usr/local/leak", "/var/tmp/leak", "/dev/leak"):\n'
                  '    attempt(p, write, p, b"secret")\n',
    "chmod_dirs": 'attempt("tree", os.makedirs, "/tmp/h{n}/a/b")\nattempt("f", fill, "/tmp/h{n}/a/b/f", {mb})\n'
                  'attempt("000", os.chmod, "/tmp/h{n}/a/b", 0)\nattempt("500", os.chmod, "/tmp/h{n}", 0o500)\n',
    "chmod_files": 'attempt("f", write, "/tmp/ro{n}", b"x")\nattempt("000", os.chmod, "/tmp/ro{n}", 0)\n'
                   'attempt("g", write, "/dev/shm/ro{n}", b"x")\nattempt("000", os.chmod, "/dev/shm/ro{n}", 0)\n',
    "chmod_tmp": 'attempt("tmp 0", os.chmod, "/tmp", 0)\nattempt("shm 0", os.chmod, "/dev/shm", 0o555)\n',
    "symlink_swap": 'for i, t in enumerate(("/opt/agentrl/worker.py", "/", "/proc/1/root", "/tmp", "/dev/shm")):\n'
                    '    attempt("ln", os.symlink, t, f"/tmp/s{n}-{{i}}")\n'
                    '    attempt("ln", os.symlink, t, f"/dev/shm/s{n}-{{i}}")\n',
    "hardlinks_fifos": 'attempt("f", write, "/tmp/base{n}", b"x")\nattempt("hl", os.link, "/tmp/base{n}", "/tmp/hl{n}")\n'
                       'attempt("fifo", os.mkfifo, "/tmp/fifo{n}")\n'
                       'u = socket.socket(socket.AF_UNIX)\nattempt("unix", u.bind, "/tmp/sock{n}")\n',
    "fill_tmp": 'attempt("tmp", fill, "/tmp/full{n}", 1 << 20)\nattempt("shm", fill, "/dev/shm/full{n}", 1 << 20)\n',
    "sysv_shm": 'attempt("shm", shm, {key}, {mb} << 20)\n',
    "sysv_sem_msg": 'attempt("sem", lambda: libc.semget({key}, 1, 0o1000 | 0o666) >= 0 or 1 / 0)\n'
                    'attempt("msg", lambda: libc.msgget({key}, 0o1000 | 0o666) >= 0 or 1 / 0)\n',
    "posix_mq": 'attempt("mq", mq, "{mq}")\n',
    "keyring": 'libc.syscall.restype = ctypes.c_long\n'
               'attempt("key", lambda: libc.syscall({add_key_nr}, b"user", b"agentrl-k", b"secret", 6, -4) >= 0 or 1 / 0)\n',
    "time_wait": 'srv = socket.create_server(("127.0.0.1", 0))\nfor _ in range(5):\n'
                 '    c = socket.create_connection(srv.getsockname()); s, _ = srv.accept(); c.close(); s.close()\n',
    "background": 'attempt("bg", subprocess.Popen, ["sleep", "300"], start_new_session=True)\n',
    "hostname": 'attempt("host", socket.sethostname, "owned")\n',
}


def attacker(actions: list[str], *, n: int, key: int, mq: str, mb: int, add_key_nr: int) -> str:
    """An attacker program doing ``actions`` (keys of :data:`ACTIONS`) in that order."""
    body = "".join(ACTIONS[a].format(n=n, key=key, mq=mq, mb=mb, add_key_nr=add_key_nr) for a in actions)
    return PRELUDE + body + 'print(len(done))\n'


def random_attacker(rng: random.Random, n: int, add_key_nr: int) -> tuple[list[str], str]:
    """A random attacker: 2-5 actions in random order with random keys, names and sizes."""
    actions = rng.sample(sorted(ACTIONS), rng.randint(2, 5))
    code = attacker(actions, n=n, key=rng.choice(SYSV_KEYS), mq=rng.choice(MQ_NAMES), mb=rng.randint(1, 8),
                    add_key_nr=add_key_nr)
    return actions, code
