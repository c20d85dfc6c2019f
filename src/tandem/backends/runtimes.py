"""How a rank runs on a remote node: the shell scripts of the ``venv`` and ``docker`` runtimes.

Both runtimes keep a per-rank folder on the node (``ssh.remote_dir/DEPLOYMENT/rankN``)::

    rankN.log     the rank's stdout and stderr (the previous start's log is kept as .1)
    pid           venv: the process-group leader; docker: absent
    exit          venv: the exit status, written when the rank ends by itself
    tmp/          TMPDIR of the rank (vLLM's IPC sockets; paths must fit in 107 bytes)

and beside them ``caches/rankN``, the rank's compile cache root (``tandem.caches``), which no
stop removes: restarts start warm, ``tandem down --purge-caches`` clears it.

- **venv**: ``vllm serve`` in its own session (``setsid``), detached from the ssh session,
  marked with ``TANDEM_DEPLOYMENT``/``TANDEM_RANK`` in its environment like every local rank.
- **docker**: ``docker run --detach`` as ``tandem.render.docker`` renders it, plus a detached
  ``docker logs -f`` that appends the container's output to the same log file, so reading logs
  is one thing for both runtimes.

Every script here is pure text (POSIX ``sh``), run by ``OpenSSH.run``; the first line a status
script prints is ``running`` or ``exited CODE`` (``exited unknown`` when killed by a signal).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from tandem import caches, wire
from tandem.rankplan import RankSpec
from tandem.redact import is_secret
from tandem.render import shellwords
from tandem.render.docker import container_name, docker_run_argv
from tandem.spec.cluster import Runtime, SSHOptions
from tandem.spec.deployment import Deployment

LOG_MAX_BYTES = 1_000_000
"""Most log bytes one poll brings back; the rest comes with the next poll."""


def resolve_runtime(options: SSHOptions, image: str | None) -> Runtime:
    """``auto`` becomes ``docker`` when the recipe names an image, else ``venv``."""
    if options.runtime is Runtime.AUTO:
        return Runtime.DOCKER if image else Runtime.VENV
    return options.runtime


def rank_dir(options: SSHOptions, deployment: str, rank: int) -> PurePosixPath:
    """The rank's folder on its node."""
    return PurePosixPath(options.remote_dir) / deployment / f"rank{rank}"


def log_path(options: SSHOptions, deployment: str, rank: int) -> PurePosixPath:
    return rank_dir(options, deployment, rank) / f"rank{rank}.log"


def run_env(directory: PurePosixPath) -> dict[str, str]:
    """Per-rank paths vLLM would otherwise share: its temp dir."""
    return {"TMPDIR": str(directory / "tmp")}


def cache_root(options: SSHOptions, deployment: str, rank: int) -> PurePosixPath:
    """The rank's compile cache root on its node (``tandem.caches``)."""
    return caches.remote_root(options.remote_dir, deployment, rank)


def _exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def _marks(deployment: str, rank: int) -> dict[str, str]:
    return {wire.TANDEM_DEPLOYMENT: deployment, wire.TANDEM_RANK: str(rank)}


def _prepare(directory: PurePosixPath, log: PurePosixPath, cache: PurePosixPath) -> str:
    d = shellwords.quote(str(directory))
    lg = shellwords.quote(str(log))
    # The rank's folder and log are the user's only (0700, 0600); the rank itself keeps the
    # node's umask, so what it writes to a shared HF cache stays readable by others.
    return (
        f"(umask 077 && mkdir -p {d}/tmp {shellwords.quote(str(cache))})\n"
        f"if [ -f {lg} ]; then mv -f {lg} {lg}.1; fi\n"
        f"rm -f {d}/pid {d}/exit\n"
        f"(umask 077 && : > {lg})\n"
    )


def _marked_pids(deployment: str, rank: int, launch: str | None = None) -> str:
    """A shell function ``marked`` printing the pids carrying the rank's marks: deployment,
    rank and, when the state has one, its launch id (a process of the same name from another
    control machine or an earlier launch is not this launch's)."""
    marks = [f"{wire.TANDEM_DEPLOYMENT}={deployment}", f"{wire.TANDEM_RANK}={rank}"]
    if launch:
        marks.append(f"{wire.TANDEM_LAUNCH}={launch}")
    first, *rest = (shlex.quote(m) for m in marks)
    return (
        "marked() { grep -lzxF "
        + first
        + " /proc/[0-9]*/environ 2>/dev/null"
        + "".join(" | xargs -r grep -lzxF " + m + " 2>/dev/null" for m in rest)
        + " | cut -d/ -f3; }\n"
    )


def _sweep(deployment: str, rank: int, grace_s: float, launch: str | None = None) -> str:
    """TERM (and CONT) every marked process, wait on evidence, KILL the rest, print survivors.

    The wait ends once only processes that ignore SIGTERM are left (multiprocessing's resource
    tracker), or after ``grace_s``.
    """
    steps = max(1, int(grace_s * 2))
    return (
        _marked_pids(deployment, rank, launch)
        + "busy() { for p in $(marked); do grep -q resource_tracker /proc/$p/cmdline "
        '2>/dev/null || echo "$p"; done; }\n'
        + 'for p in $(marked); do kill -TERM "$p" 2>/dev/null || true; '
        'kill -CONT "$p" 2>/dev/null || true; done\n'
        + f'i=0; while [ $i -lt {steps} ] && [ -n "$(busy)" ]; do sleep 0.5; '
        "i=$((i+1)); done\n"
        + 'for p in $(marked); do kill -KILL "$p" 2>/dev/null || true; done\n'
        + "sleep 0.3; echo \"survivors: $(marked | tr '\\n' ' ')\"\n"
    )


@dataclass(frozen=True)
class VenvRuntime:
    """A vLLM installed on the host, started as a detached process group."""

    options: SSHOptions
    name = Runtime.VENV

    def program(self) -> str:
        return self.options.vllm_command

    def start_script(self, rank: RankSpec, deployment: Deployment) -> str:
        directory = rank_dir(self.options, deployment.name, rank.rank)
        log = log_path(self.options, deployment.name, rank.rank)
        cache = cache_root(self.options, deployment.name, rank.rank)
        d = shellwords.quote(str(directory))
        vllm = shlex.split(self.options.vllm_command)
        argv = shlex.join([*vllm, *rank.argv[1:]])
        return (
            "set -e\n"
            f"command -v {shlex.quote(vllm[0])} >/dev/null 2>&1 || "
            f"{{ echo '{vllm[0]}: command not found' >&2; exit 127; }}\n"
            + _prepare(directory, log, cache)
            + _exports({**caches.cache_env(cache), **rank.env, **run_env(directory)})
            + "\n"
            # The wrapper shell leads the new session; it records its pid, runs vLLM and, if vLLM
            # ends by itself, its exit status.
            + f'setsid sh -c \'d=$1; shift; echo $$ > "$d/pid"; "$@"; echo $? > "$d/exit"\''
            f" rank {d} {argv} > {shellwords.quote(str(log))} 2>&1 < /dev/null &\n"
            f"i=0; while [ ! -s {d}/pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n"
            f"cat {d}/pid\n"
        )

    def status_script(self, deployment: str, rank: int) -> str:
        d = shellwords.quote(str(rank_dir(self.options, deployment, rank)))
        mark = shlex.quote(f"{wire.TANDEM_DEPLOYMENT}={deployment}")
        return (
            f"pid=$(cat {d}/pid 2>/dev/null || true)\n"
            f'if [ -n "$pid" ] && grep -qzxF {mark} /proc/$pid/environ 2>/dev/null; '
            "then echo running; "
            f'else echo "exited $(cat {d}/exit 2>/dev/null || echo unknown)"; fi\n'
        )

    def stop_script(
        self, deployment: str, rank: int, grace_s: float = 30, launch: str | None = None
    ) -> str:
        d = shellwords.quote(str(rank_dir(self.options, deployment, rank)))
        mark = shlex.quote(f"{wire.TANDEM_DEPLOYMENT}={deployment}")
        # The recorded group first (only if its leader still carries the mark), then the sweep.
        return (
            f"pid=$(cat {d}/pid 2>/dev/null || true)\n"
            f'if [ -n "$pid" ] && grep -qzxF {mark} /proc/$pid/environ 2>/dev/null; '
            'then kill -TERM -- "-$pid" 2>/dev/null || true; fi\n'
            + _sweep(deployment, rank, grace_s, launch)
            + f"rm -rf {d}/tmp\n"
        )


@dataclass(frozen=True)
class DockerRuntime:
    """One container per rank from the recipe's image, pinned to the digest found on the nodes."""

    options: SSHOptions
    image: str
    name = Runtime.DOCKER

    def program(self) -> str:
        return self.options.docker_command

    def run_argv(self, rank: RankSpec, deployment: Deployment) -> list[str]:
        return docker_run_argv(
            rank, deployment, image=self.image, docker=self.options.docker_command
        )

    def start_script(self, rank: RankSpec, deployment: Deployment) -> str:
        directory = rank_dir(self.options, deployment.name, rank.rank)
        log = log_path(self.options, deployment.name, rank.rank)
        d = shellwords.quote(str(directory))
        docker = shlex.split(self.options.docker_command)
        name = container_name(deployment.name, rank.rank)
        secrets = {k: v for k, v in rank.env.items() if is_secret(k)}
        logs_argv = shlex.join([*docker, "logs", "--follow", name])
        return (
            "set -e\n"
            f"command -v {shlex.quote(docker[0])} >/dev/null 2>&1 || "
            f"{{ echo '{docker[0]}: command not found' >&2; exit 127; }}\n"
            + _prepare(directory, log, cache_root(self.options, deployment.name, rank.rank))
            + f"{shlex.join([*docker, 'rm', '--force', name])} >/dev/null 2>&1 || true\n"
            + _exports(secrets)
            + ("\n" if secrets else "")
            + f"{shellwords.join(self.run_argv(rank, deployment))} > {d}/cid\n"
            + _exports(_marks(deployment.name, rank.rank))
            + "\n"
            + f"setsid {logs_argv} > {shellwords.quote(str(log))} 2>&1 < /dev/null &\n"
            + f"cat {d}/cid\n"
        )

    def status_script(self, deployment: str, rank: int) -> str:
        docker = self.options.docker_command
        name = shlex.quote(container_name(deployment, rank))
        return (
            f"s=$({docker} inspect --format '{{{{.State.Running}}}} {{{{.State.ExitCode}}}}' "
            f"{name} 2>/dev/null || echo 'false unknown')\n"
            'case "$s" in true*) echo running;; *) echo "exited ${s#* }";; esac\n'
        )

    def stop_script(
        self, deployment: str, rank: int, grace_s: float = 30, launch: str | None = None
    ) -> str:
        docker = self.options.docker_command
        name = shlex.quote(container_name(deployment, rank))
        d = shellwords.quote(str(rank_dir(self.options, deployment, rank)))
        return (
            f"{docker} stop --time {int(grace_s)} {name} >/dev/null 2>&1 || true\n"
            f"{docker} rm --force {name} >/dev/null 2>&1 || true\n"
            + _sweep(deployment, rank, 5, launch)
            + f"rm -rf {d}/tmp\n"
        )


def poll_script(status_script: str, log: PurePosixPath, offset: int) -> str:
    """Status line, then ``SIZE OFFSET`` of the log, then the log's bytes from OFFSET.

    A log shorter than ``offset`` was rotated by a restart; reading starts over at 0.
    """
    lg = shellwords.quote(str(log))
    return (
        status_script
        + f"s=$(stat -c %s {lg} 2>/dev/null || echo 0); off={offset}\n"
        + 'if [ "$s" -lt "$off" ]; then off=0; fi\n'
        + 'echo "$s $off"\n'
        + f'if [ "$s" -gt "$off" ]; then tail -c +$((off+1)) {lg} | '
        f"head -c {LOG_MAX_BYTES}; fi\n"
    )


def tail_script(log: PurePosixPath, lines: int) -> str:
    return f"tail -n {int(lines)} {shellwords.quote(str(log))} 2>/dev/null || true\n"
