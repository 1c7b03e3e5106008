#!/usr/bin/env python3
"""scripts/baton-up end to end: brings a cluster up from a build folder,
runs the curl it prints (must answer a chat completion), then Ctrl-C
(SIGINT) must stop every process it started, leaving no orphans.

  test_router_baton_up.py --build DIR [--colocated]"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_cluster import SOURCE, free_port  # noqa: E402


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie awaiting its parent counts as gone
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--colocated", action="store_true")
    args = ap.parse_args()
    port = free_port()
    argv = [os.path.join(SOURCE, "scripts", "baton-up"), "--build", args.build, "--port",
            str(port), "--threads", "2", "--kv-blocks", "1024"]
    if args.colocated:
        argv.append("--colocated")
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fails = []
    out_lines = []
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            out_lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        out = "".join(out_lines)
        if "baton is up: http://127.0.0.1:%d/v1" % port not in out:
            fails.append("no 'baton is up' line: %r / %s" % (out, up.stderr.read()
                                                               if up.poll() is not None else ""))
        else:
            m = re.search(r"^  (curl .*?)\n    (-d .*?)$", out, re.M | re.S)
            cmd = (m.group(1).rstrip(" \\") + " " + m.group(2)) if m else ""
            res = subprocess.run(["bash", "-c", cmd + " -s"], capture_output=True, text=True,
                                 timeout=120)
            try:
                body = json.loads(res.stdout)
                ok = body["object"] == "chat.completion" and body["choices"][0]["message"][
                    "content"] != ""
            except (ValueError, KeyError):
                ok = False
            if not ok:
                fails.append("printed curl did not answer: %r rc %d %r %r" % (cmd, res.returncode, res.stdout[:300], res.stderr[:300]))
            else:
                print("ok   printed curl answered: %r" %
                      body["choices"][0]["message"]["content"][:60])
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            fails.append("baton-up did not exit within 30 s of SIGINT")
    err = up.stderr.read()
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", err)]
    expect = 2 if args.colocated else 3
    if len(pids) != expect:
        fails.append("expected %d processes, saw %s" % (expect, pids))
    time.sleep(0.5)
    orphans = [p for p in pids if alive(p)]
    if orphans:
        fails.append("orphans after Ctrl-C: %s" % orphans)
        for p in orphans:
            os.kill(p, signal.SIGKILL)
    else:
        print("ok   Ctrl-C stopped all %d processes" % len(pids))
    if "stopped; logs in" not in err:
        fails.append("no stop message: %s" % err[-500:])
    for f in fails:
        print("FAIL " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
