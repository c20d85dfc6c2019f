"""vLLM's router on a node of an ssh cluster (``ssh.router_node``), reached over ssh.

The router is started the way the venv runtime starts a rank: a detached session on the node,
its folder and log under ``remote_dir/NAME/router``. It is found again by its identity on that
node (pid, start time, boot id), read right after the start, as tandem finds its own processes
here (``tandem.backends.processes``): vllm-router renames itself ``vllm::router`` and, in
doing so, blanks its ``/proc/PID/environ``, so the environment marks by which ranks are found
would not survive. A pid whose start time or boot differs is another process and is never
signalled. It binds the node's address: that is where clients reach the deployment, and where
tandem calls its admin API.

The version the recipe pins is read from the Python that the node's ``vllm-router`` script runs
(the router has no ``--version``), before anything starts.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from pydantic import BaseModel, Field

from tandem.backends.openssh import OpenSSH, SSHTarget
from tandem.backends.processes import ProcessIdentity
from tandem.errors import BackendError
from tandem.render import shellwords
from tandem.spec.cluster import Cluster

FOLDER = "router"
"""The router's folder beside the ranks' (``rank0`` ...) under ``remote_dir/NAME``."""


class RouterNode(BaseModel):
    """Where a router runs over ssh: the node and how to reach it (kept in the deployment's
    record, so ``status`` and ``down`` find it without the cluster file)."""

    node: str
    address: str = Field(description="The node's address: the router binds it.")
    ssh_host: str
    ssh_user: str | None = None
    ssh_port: int | None = None
    config_file: str | None = None
    connect_timeout_s: float = 10
    remote_dir: str
    command: str = Field(description="The node's vllm-router program (ssh.router_command).")
    deployment: str

    @classmethod
    def of(cls, cluster: Cluster, deployment: str) -> RouterNode | None:
        """The router's place when the cluster names ``ssh.router_node``, else None."""
        name = cluster.ssh.router_node
        if name is None:
            return None
        node = next(n for n in cluster.nodes if n.name == name)  # the spec checked the name
        ssh = OpenSSH.for_cluster(cluster)
        return cls(
            node=node.name,
            address=node.address,
            ssh_host=node.ssh_host or node.address,
            ssh_user=node.ssh_user,
            ssh_port=node.ssh_port,
            config_file=ssh.config_file,
            connect_timeout_s=cluster.ssh.connect_timeout_s,
            remote_dir=cluster.ssh.remote_dir,
            command=cluster.ssh.router_command,
            deployment=deployment,
        )

    @property
    def folder(self) -> PurePosixPath:
        return PurePosixPath(self.remote_dir) / self.deployment / FOLDER

    @property
    def log(self) -> PurePosixPath:
        return self.folder / "router.log"

    def run(self, script: str, *, timeout_s: float = 60) -> str:
        """Run ``script`` on the node; its stdout.

        Raises:
            SSHError: the node cannot be reached.
            BackendError: the script failed.
        """
        ssh = OpenSSH(config_file=self.config_file, connect_timeout_s=self.connect_timeout_s)
        target = SSHTarget(
            node=self.node, host=self.ssh_host, user=self.ssh_user, port=self.ssh_port
        )
        result = ssh.run(target, script, timeout_s=timeout_s, program=self.command)
        if not result.ok:
            raise BackendError(
                f"the router's script failed on {self.node} (exit {result.returncode}): "
                f"{result.stderr.strip()[-300:]}",
                node=self.node,
            )
        return result.stdout

    def version(self) -> str | None:
        """The vllm-router release of the node's program, None when it cannot be read.

        Raises:
            SSHError: the node cannot be reached, or the program is not there.
        """
        program = shlex.quote(shlex.split(self.command)[0])
        out = self.run(
            f"p=$(command -v {program}) || exit 127\n"  # SSHError names the missing program
            "py=$(sed -n '1s/^#!//p' \"$p\")\n"
            '[ -n "$py" ] && $py -c \'import importlib.metadata as m; '
            'print(m.version("vllm-router"))\' 2>/dev/null || true\n'
        )
        return out.strip() or None

    def start_script(self, argv: list[str]) -> str:
        """Start the router detached, its output in ``router.log``; print its identity
        (``PID START_TICKS BOOT_ID``)."""
        folder = shellwords.quote(str(self.folder))
        log = shellwords.quote(str(self.log))
        return (
            "set -e\n"
            f"(umask 077 && mkdir -p {folder})\n"
            f"if [ -f {log} ]; then mv -f {log} {log}.1; fi\n"
            f"(umask 077 && : > {log})\n"
            f"rm -f {folder}/pid\n"
            f'setsid sh -c \'echo $$ > "$1/pid"; shift; exec "$@"\' router {folder} '
            f"{shlex.join(argv)} >> {log} 2>&1 < /dev/null &\n"
            f"i=0; while [ ! -s {folder}/pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n"
            f"pid=$(cat {folder}/pid)\n"
            "s=$(cat /proc/$pid/stat); rest=${s##*) }; set -- $rest\n"
            'echo "$pid ${20} $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)"\n'
        )

    def alive(self, router: ProcessIdentity) -> bool:
        """The router still runs on the node (False when the node cannot be reached: nothing
        there can be shown to serve)."""
        try:
            return (
                self.run(_ours(router) + "if ours; then echo alive; fi\n", timeout_s=30).strip()
                == "alive"
            )
        except BackendError:
            return False

    def stop(self, router: ProcessIdentity, grace_s: float = 10) -> bool:
        """TERM the router, KILL it after ``grace_s``; True when it was running.

        Raises:
            SSHError: the node cannot be reached.
            BackendError: it survived SIGKILL.
        """
        steps = max(1, int(grace_s * 10))
        out = self.run(
            _ours(router)
            + "if ! ours; then echo gone; exit 0; fi\n"
            + f"kill -TERM {router.pid} 2>/dev/null || true\n"
            + f"i=0; while ours && [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); done\n"
            + f"if ours; then kill -KILL {router.pid} 2>/dev/null || true; sleep 0.3; fi\n"
            + "if ours; then echo survived; else echo stopped; fi\n"
        ).strip()
        if out == "survived":
            raise BackendError(
                f"the router on {self.node} (pid {router.pid}) survived SIGKILL", node=self.node
            )
        return out == "stopped"

    def tail(self, lines: int = 20) -> str:
        """The end of the router's log on the node ('' when it cannot be read)."""
        try:
            return self.run(f"tail -n {int(lines)} {shellwords.quote(str(self.log))} || true")
        except BackendError:
            return ""


def _ours(router: ProcessIdentity) -> str:
    """A shell function ``ours``: true while pid ``router.pid`` is the router tandem started
    (same start time, same boot, not a zombie)."""
    boot = (
        f'[ "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" = {shlex.quote(router.boot)} ] && '
        if router.boot
        else ""
    )
    return (
        "ours() { s=$(cat /proc/" + str(router.pid) + "/stat 2>/dev/null) || return 1; "
        'rest=${s##*) }; set -- $rest; [ "$1" != Z ] && '
        + boot
        + f'[ "${{20}}" = {router.start_ticks} ]; }}\n'
    )
