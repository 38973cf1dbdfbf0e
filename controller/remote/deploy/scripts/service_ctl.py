
import os, signal, subprocess, sys, time
action, mode, agent = sys.argv[1:4]
pidfile = os.path.join(agent, "supervisor.pid")
launcher = os.path.join(agent, "run-agent.sh")
def running():
    try:
        pid = int(open(pidfile).read())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return pid if launcher.encode() in f.read() else None
    except (ValueError, OSError):
        return None
if mode == "systemd":
    env = dict(os.environ, XDG_RUNTIME_DIR="/run/user/%d" % os.getuid())
    for cmd in (["daemon-reload"], ["enable", "fleet-agent.service"], [action, "fleet-agent.service"]):
        subprocess.run(["systemctl", "--user"] + cmd, check=True, env=env)
    sys.exit(0)
pid = running()
if pid and action in ("restart", "stop"):
    pgid = os.getpgid(pid)  # the supervisor's session: it and the agent with its children
    os.kill(pid, signal.SIGTERM)  # the supervisor passes it to the agent alone: a clean interrupt of its run
    deadline = time.time() + 60
    while running() and time.time() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
if action == "stop" or (action == "start" and pid):
    sys.exit(0)
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
fd = os.open(os.devnull, os.O_RDWR)
for i in (0, 1, 2):
    os.dup2(fd, i)
os.execv("/bin/sh", ["sh", launcher])
