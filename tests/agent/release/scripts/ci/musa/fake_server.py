"""Stand-in server: /health on SERVER_HOST:SERVER_PORT; faults via FAKE_SERVER_MODE."""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

mode = os.environ.get("FAKE_SERVER_MODE", "")
record = os.environ.get("FAKE_RECORD_DIR")
key = os.environ.get("FAKE_KEY_NAME", sys.argv[1])
if record:
    with open(os.path.join(record, f"server-{os.getpid()}.json"), "w") as f:
        json.dump({"script": sys.argv[1], "env": dict(os.environ), "pgid": os.getpgid(0)}, f)
if os.environ.get("FAKE_SETUP") != "1":
    print("server: setup_env.sh variables missing", file=sys.stderr)
    sys.exit(4)
if mode == "start-fail":
    print("server: cannot load model", file=sys.stderr)
    sys.exit(5)
# a child in the same process group, like a tokenizer worker, left running
subprocess.Popen(["sleep", "300"])
if mode == "escape":  # a child in its own session: only a descendant scan finds it
    subprocess.Popen(["sleep", "301"], start_new_session=True)
if mode == "ignore-term":
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and mode != "never-ready"
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"ok" if ok else b"starting")

    def do_POST(self):  # the agent's first request after ready (FAKE_WARMUP_SLEEP: how long it takes)
        if self.path != "/v1/completions":
            self.send_response(404)
            self.end_headers()
            return
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(float(os.environ.get("FAKE_WARMUP_SLEEP", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"choices": [{"text": "!"}]}')

    def log_message(self, *a):
        pass


srv = http.server.ThreadingHTTPServer((os.environ["SERVER_HOST"], int(os.environ["SERVER_PORT"])), H)
print(f"serving on {srv.server_address}", flush=True)
if mode == "crash":
    threading.Timer(float(os.environ.get("FAKE_CRASH_AFTER", "0.5")), lambda: os._exit(11)).start()
srv.serve_forever()
