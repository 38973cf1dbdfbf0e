
import fcntl, hashlib, json, os, queue, re, shutil, sys, threading, time
mode, workdir, digest, name, size, offset = sys.argv[1:7]
size = int(size); offset = int(offset)
keep_newest = int(sys.argv[7]) if len(sys.argv) > 7 else 0
kept = set(sys.argv[8:]) | {digest}
root = os.path.join(os.path.expanduser(workdir), "incoming")
folder = os.path.join(root, digest)
final = os.path.join(folder, name)
part = os.path.join(folder, "." + name + ".part")
def sz(p):
    try:
        return os.stat(p).st_size
    except FileNotFoundError:
        return -1
def done(**kw):
    kw.setdefault("path", final)
    print(json.dumps(kw)); sys.exit(0)
def arriving(d):  # a transfer holds the lock on its partial file while it writes
    for f in os.listdir(d):
        if f.endswith(".part"):
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
    return False
def prune():  # the releases pushed here beyond the keep_newest last pushed, unless kept or arriving
    if keep_newest < 1:
        return []
    try:
        found = [n for n in os.listdir(root) if re.fullmatch("[0-9a-f]{64}", n)
                 and os.path.isdir(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n))]
    except OSError:
        return []
    def pushed_at(n):  # another push's probe may remove a folder meanwhile
        try:
            return os.stat(os.path.join(root, n)).st_mtime
        except OSError:
            return 0.0
    found.sort(key=pushed_at, reverse=True)
    gone = []
    for n in found[keep_newest:]:
        d = os.path.join(root, n)
        try:
            if n in kept or arriving(d):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not os.path.exists(d):
            gone.append(n)
    return gone
if mode == "probe":
    pruned = prune()
    st = os.statvfs(os.path.dirname(folder) if os.path.isdir(os.path.dirname(folder)) else os.path.expanduser("~"))
    done(final=sz(final), part=max(sz(part), 0), free=st.f_bavail * st.f_frsize, pruned=pruned)
os.makedirs(folder, mode=0o755, exist_ok=True)
if sz(final) == size:
    done(ok=True, skipped=True, received=0)
fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
deadline = time.time() + 60
while True:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); break
    except BlockingIOError:
        if time.time() > deadline:
            done(ok=False, error="another transfer of this release is still writing " + part)
        time.sleep(0.2)
have = os.fstat(fd).st_size
if have < offset:
    done(ok=False, error="partial file is %d bytes, expected at least %d; retry" % (have, offset))
os.ftruncate(fd, offset)
h = hashlib.sha256()
f = os.fdopen(fd, "r+b", buffering=0)
left = offset
while left:
    b = f.read(min(left, 1 << 20))
    if not b:
        break
    h.update(b); left -= len(b)
f.seek(offset)
src = sys.stdin.buffer.raw
if hasattr(fcntl, "F_SETPIPE_SZ"):
    try:  # a 1 MiB pipe from sshd instead of 64 KiB: 16x fewer reads and wake-ups, about half the receiver's CPU
        fcntl.fcntl(src.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass  # not a pipe, or over the user's pipe quota: the default size works too
chunks = queue.Queue(16)
def hash_chunks():  # sha256 on its own thread (hashlib lets go of the GIL): reading and writing go on
    while True:
        b = chunks.get()
        if b is None:
            return
        h.update(b)
spans = queue.Queue()
def write_back():  # off the reading thread: start writing each finished window to disk, drop the one before
    before = None  # from the page cache (the final fsync has little left; a release does not evict model weights)
    while True:
        span = spans.get()
        if span is None:
            return
        try:
            os.posix_fadvise(f.fileno(), span[0], span[1], os.POSIX_FADV_DONTNEED)
            if before is not None:
                os.posix_fadvise(f.fileno(), before[0], before[1], os.POSIX_FADV_DONTNEED)
        except OSError:
            return  # a file system without it: the final fsync does all the writing
        before = span
workers = [threading.Thread(target=hash_chunks, daemon=True)]
if hasattr(os, "posix_fadvise"):
    workers.append(threading.Thread(target=write_back, daemon=True))
for w in workers:
    w.start()
got = 0
flushed = offset
WINDOW = 32 << 20
while True:
    b = src.read(1 << 20)
    if not b:
        break
    chunks.put(b)
    n = f.write(b)
    while n < len(b):
        n += f.write(memoryview(b)[n:])
    got += n
    if offset + got - flushed >= WINDOW:
        spans.put((flushed, offset + got - flushed))
        flushed = offset + got
chunks.put(None)
spans.put(None)
for w in workers:
    w.join()
t_sync = time.monotonic()
os.fsync(f.fileno())
total = offset + got
if total != size:
    done(ok=False, received=got, error="transfer ended after %d of %d bytes (kept for resume)" % (total, size))
if h.hexdigest() != digest:
    os.unlink(part)
    done(ok=False, received=got, error="sha256 mismatch on arrival: got %s; partial file removed" % h.hexdigest())
os.chmod(part, 0o644)
os.replace(part, final)
d = os.open(folder, os.O_RDONLY)
try:  # the rename itself on disk: a release reported ok is there after a power cut
    os.fsync(d)
finally:
    os.close(d)
done(ok=True, skipped=False, received=got, sync_s=round(time.monotonic() - t_sync, 3))
