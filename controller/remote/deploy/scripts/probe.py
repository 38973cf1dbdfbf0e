
import json, os, platform, subprocess, sys
workdir = os.path.abspath(os.path.expanduser(sys.argv[1]))
agent = os.path.join(workdir, "agent")
def read(p):
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
try:
    state = json.loads(read(os.path.join(agent, "state.json")) or "{}")
except ValueError:
    state = {}
d = workdir
while not os.path.isdir(d):
    d = os.path.dirname(d)
st = os.statvfs(d)
uid = os.getuid()
systemd = os.path.isdir("/run/systemd/system") and os.path.exists("/run/user/%d/bus" % uid)
running = False
if state.get("mode") == "systemd":
    if systemd:
        env = dict(os.environ, XDG_RUNTIME_DIR="/run/user/%d" % uid)
        r = subprocess.run(["systemctl", "--user", "is-active", "fleet-agent.service"],
                           capture_output=True, text=True, env=env)
        running = r.stdout.strip() == "active"
else:
    try:
        pid = int(read(os.path.join(agent, "supervisor.pid")) or "")
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            running = os.path.join(agent, "run-agent.sh").encode() in f.read()
    except (ValueError, OSError):
        pass
wd = os.path.join(agent, "wheels")
wheels = {n: os.path.getsize(os.path.join(wd, n)) for n in os.listdir(wd)} if os.path.isdir(wd) else {}
print(json.dumps({
    "python": sys.executable, "version": list(sys.version_info[:3]), "machine": platform.machine(),
    "glibc": platform.libc_ver()[1] or None, "home": os.path.expanduser("~"), "workdir": workdir,
    "free": st.f_bavail * st.f_frsize, "systemd_user": systemd, "running": running,
    "venv_ok": os.access(os.path.join(agent, "venv", "bin", "python"), os.X_OK),
    "wheels": wheels, "state": state if isinstance(state, dict) else {},
}))
