#!/usr/bin/env python3
"""Smoke test for a llama-server build: start it on a free loopback port with the model, wait for
/health 200, run one short completion, stop it. Exits 0 when the server served; otherwise prints
the server's last log lines and what failed, and exits 1 when the server crashed (the build runs
instructions this machine does not: remembered) or 3 when it did not answer in time (a busy
machine: tried again next time).

Usage: smoke-llama.py LLAMA_SERVER MODEL
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HEALTH_TIMEOUT_S = 120
COMPLETION_TIMEOUT_S = 120


def say(msg):
    print(f"install-llama: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    # The server must not outlive this script, even if the script is killed.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def exit_reason(code):
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exit status {code}"


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    server, model = sys.argv[1], sys.argv[2]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="llama-smoke-", suffix=".log", delete=False)
    args = [server, "--model", model, "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", "512", "--threads", str(os.cpu_count() or 1)]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    failure = None
    crashed = False
    try:
        failure = exercise(proc, base, started)
        crashed = proc.poll() is not None
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    if failure:
        with open(log.name, errors="replace") as f:
            lines = f.read().splitlines()[-20:]
        say("smoke test FAILED; the server's last log lines:")
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        say(failure)
    os.unlink(log.name)
    if not failure:
        return 0
    return 1 if crashed else 3


def exercise(proc, base, started):
    crash_hint = ("a crash while loading or on the first decode usually means the build uses "
                  "instructions this CPU (or its hypervisor) does not run")
    deadline = started + HEALTH_TIMEOUT_S
    while True:
        code = proc.poll()
        if code is not None:
            return f"llama-server exited before it was healthy ({exit_reason(code)}); {crash_hint}"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            return (f"llama-server was not healthy after {HEALTH_TIMEOUT_S} s; "
                    "check that the model file is complete and the machine is not overloaded")
        time.sleep(0.05)
    healthy_after = time.monotonic() - started
    body = json.dumps({"prompt": "The capital of France is", "n_predict": 8,
                       "temperature": 0, "seed": 1}).encode()
    req = urllib.request.Request(f"{base}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=COMPLETION_TIMEOUT_S) as r:
            answer = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        code = proc.poll()
        if code is not None:
            return f"llama-server died during the test completion ({exit_reason(code)}); {crash_hint}"
        return f"the test completion failed: {e}"
    content = answer.get("content")
    predicted = answer.get("tokens_predicted", 0)
    if not isinstance(content, str) or predicted < 1:
        return f"the test completion returned no tokens: {json.dumps(answer)[:300]}"
    speed = (answer.get("timings") or {}).get("predicted_per_second")
    speed = f", {speed:.1f} tokens/s" if isinstance(speed, (int, float)) else ""
    say(f"smoke test passed: /health 200 after {healthy_after:.1f} s; "
        f"completion {content.strip()[:40]!r} ({predicted} tokens{speed})")
    return None


if __name__ == "__main__":
    sys.exit(main())
