"""Stand-in benchmark: prints tables/<MODEL_KEY>.txt; faults via FAKE_BENCH_MODE."""
import json
import os
import sys
import time
import urllib.request

key = os.environ["MODEL_KEY"]
mode = os.environ.get("FAKE_BENCH_MODE", "")
here = os.path.dirname(os.path.abspath(__file__))
record = os.environ.get("FAKE_RECORD_DIR")
if record:
    with open(os.path.join(record, f"bench-{key}.json"), "w") as f:
        json.dump(dict(os.environ), f)
url = f"http://{os.environ['SERVER_HOST']}:{os.environ['SERVER_PORT']}/health"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
opener.open(url, timeout=5).read()
print(f"benchmark {key} against {url}", file=sys.stderr, flush=True)
if mode == "hang":
    time.sleep(3600)
if mode == "no-table":
    print("benchmark finished, nothing to report")
    sys.exit(0)
with open(os.path.join(here, "..", "..", "..", "tables", f"{key}.txt"), encoding="utf-8") as f:
    text = f.read()
if mode == "bad-table":
    lines = text.splitlines()
    lines[3] = lines[3].replace("\t", "\tabc\t", 1)
    text = "\n".join(lines) + "\n"
if mode == "wait-server-death":  # print half, then keep asking the server until it is gone
    lines = text.splitlines()
    print("\n".join(lines[:4]), flush=True)
    while True:
        try:
            opener.open(url, timeout=1).read()
        except OSError:
            print("server went away", file=sys.stderr, flush=True)
            time.sleep(3600)
        time.sleep(0.1)
sys.stdout.write(text)
if mode == "exit1":
    sys.exit(1)
