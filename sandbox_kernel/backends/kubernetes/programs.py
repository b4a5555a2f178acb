"""The few lines of Python the backend runs in a pod for itself, through exec (which
takes neither a working folder, nor variables, nor a file's bytes): each is started
with ``python3 -I -c`` (:func:`sandbox_kernel.agent.inline`), the sandbox's own python3
found on the PATH the pod was made with."""

# Runs a command in another folder and with more variables (exec has neither), and on
# a terminal first says its pid (so closing the terminal can hang its session up).
LAUNCH = (
    "import json, os, sys\n"
    "os.chdir(sys.argv[1])\n"
    "os.environ.update(json.loads(sys.argv[2]))\n"
    "if sys.argv[3] == '1':\n"
    "    os.write(1, b'\\x1b]sk-pid;%d\\x07' % os.getpid())\n"
    "os.execvp(sys.argv[4], sys.argv[4:])\n"
)
PID_PREFIX, PID_END = b"\x1b]sk-pid;", b"\x07"
# Writes stdin to a file: chunks with a 4-byte length in front, ended by an empty one
# (stdin's own end cannot be sent over every stream protocol). Parents are made.
WRITE = (
    "import os, struct, sys\n"
    "path = sys.argv[1]\n"
    "os.makedirs(os.path.dirname(path) or '.', exist_ok=True)\n"
    "read = sys.stdin.buffer.read\n"
    "with open(path, 'wb') as out:\n"
    "    while True:\n"
    "        n = struct.unpack('!I', read(4))[0]\n"
    "        if not n:\n"
    "            break\n"
    "        out.write(read(n))\n"
    "print('ok', flush=True)\n"
)
# Reads a file to stdout, after one byte saying whether it could be opened.
READ = (
    "import shutil, sys\n"
    "try:\n"
    "    f = open(sys.argv[1], 'rb')\n"
    "except OSError as exc:\n"
    "    sys.stdout.buffer.write(b'E' + str(exc).encode()); sys.exit(2)\n"
    "sys.stdout.buffer.write(b'K'); shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)\n"
)
USAGE = (
    "import os\n"
    "def num(path, key=None):\n"
    "    try:\n"
    "        with open(path) as f:\n"
    "            if key is None: return int(f.read().split()[0])\n"
    "            for line in f:\n"
    "                k, v = line.split()[:2]\n"
    "                if k == key: return int(v)\n"
    "    except (OSError, ValueError, IndexError): return None\n"
    "c = '/sys/fs/cgroup/'\n"
    "mem = num(c + 'memory.current')\n"
    "if mem is not None:\n"
    "    mem -= num(c + 'memory.stat', 'inactive_file') or 0; cpu = (num(c + 'cpu.stat', 'usage_usec') or 0) / 1e6\n"
    "else:\n"
    "    mem = (num(c + 'memory/memory.usage_in_bytes') or 0) - (num(c + 'memory/memory.stat', 'total_inactive_file') or 0)\n"
    "    cpu = (num(c + 'cpuacct/cpuacct.usage') or num(c + 'cpu,cpuacct/cpuacct.usage') or 0) / 1e9\n"
    "print(max(mem, 0), cpu)\n"
)
