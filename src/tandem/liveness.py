"""The health model as a Kubernetes liveness probe: a stdlib-only script run in the rank's pod.

vLLM has no endpoint that means "the engine makes progress": ``/health`` stays 200 while a
worker is gone or an all-reduce hangs. So the rendered LeaderWorkerSet runs this file as an
``exec`` probe (``python3 -c SOURCE ARGS``; vLLM's images have Python), with the same rules as
``tandem.health``:

- every role: the rank's vLLM processes (``vllm``, ``VLLM::EngineCore`` on the leader,
  ``VLLM::Worker_TPn``) are there and none is stopped;
- leader: ``/health`` is 200; under load (``vllm:num_requests_running`` > 0) the token
  counters moved within ``--stall`` seconds (kept between probe runs in ``--state-file``);
  idle, a 1-token canary completion answers within ``--canary-timeout``.

Exit 0 means alive; 1 prints the reason (the kubelet records it in the pod's events) and, after
``failureThreshold`` failures, restarts the container, which LeaderWorkerSet turns into a restart
of the whole group (``RecreateGroupOnPodRestart``).

Processes are those carrying ``TANDEM_DEPLOYMENT=--deployment`` (every process of a pod does;
``SPT_NOENV=1`` keeps the mark readable after vLLM renames them).
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

TOKENS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
RUNNING = "vllm:num_requests_running"


def processes(deployment):
    """(pid, name, state) of every process marked with the deployment."""
    mark = ("TANDEM_DEPLOYMENT=" + deployment).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if mark not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state = stat[stat.rindex(")") + 2 :].split()[0]
        if state not in ("Z", "X"):
            found.append((int(entry), name, state))
    return found


def check_processes(role, deployment):
    found = processes(deployment)
    stopped = [p for p in found if p[2] in ("T", "t")]
    if stopped:
        return f"{stopped[0][1]} (pid {stopped[0][0]}) is stopped"
    names = [p[1] for p in found]
    # the kernel keeps 15 characters of a renamed process's name: VLLM::EngineCor(e)
    needed = ["VLLM::Worker"] + (["VLLM::EngineCor"] if role == "leader" else [])
    missing = [n for n in needed if not any(name.startswith(n) for name in names)]
    if missing:
        return f"no {' and no '.join(missing)} process (found: {', '.join(names) or 'none'})"
    return None


def _get(url, key, timeout, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode(errors="replace")


def metrics(text):
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in TOKENS or name == RUNNING:
            try:
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return values


def check_leader(args, key):
    try:
        status, _ = _get(f"{args.url}/health", key, 5)
    except (OSError, urllib.error.URLError) as exc:
        return f"/health: {exc}"
    if status != 200:
        return f"/health answered {status}"
    try:
        _, text = _get(f"{args.url}/metrics", key, 5)
    except (OSError, urllib.error.URLError) as exc:
        return f"/metrics: {exc}"
    values = metrics(text)
    tokens = sum(values.get(name, 0.0) for name in TOKENS)
    now = time.time()
    try:
        with open(args.state_file) as handle:
            last = json.load(handle)
    except (OSError, ValueError):
        last = {}
    if values.get(RUNNING, 0) > 0:
        if last.get("tokens") == tokens and now - last.get("since", now) >= args.stall:
            return (
                f"{values[RUNNING]:g} request(s) running and no token counted for "
                f"{now - last['since']:.0f} s"
            )
        if last.get("tokens") != tokens:
            last = {"tokens": tokens, "since": now}
    else:
        last = {"tokens": tokens, "since": now}
        started = time.monotonic()
        try:
            _get(
                f"{args.url}/v1/completions",
                key,
                args.canary_timeout,
                body={"model": args.model, "prompt": "health", "max_tokens": 1, "temperature": 0},
            )
        except (OSError, urllib.error.URLError) as exc:
            return f"a 1-token canary failed after {time.monotonic() - started:.1f} s: {exc}"
    with open(args.state_file, "w") as handle:
        json.dump(last, handle)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tandem-liveness")
    parser.add_argument("role", choices=("leader", "worker"))
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="")
    parser.add_argument("--stall", type=float, default=30.0)
    parser.add_argument("--canary-timeout", type=float, default=10.0)
    parser.add_argument("--state-file", default="/tmp/tandem-liveness.json")
    args = parser.parse_args(argv)
    problem = check_processes(args.role, args.deployment)
    if problem is None and args.role == "leader":
        problem = check_leader(args, os.environ.get("VLLM_API_KEY"))
    if problem:
        print(f"not alive: {problem}")
        return 1
    print("alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
