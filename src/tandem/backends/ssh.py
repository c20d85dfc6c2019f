"""The ssh backend: each rank on its own node, reached with the system's OpenSSH client.

``up`` runs these steps in order, each one logged as it happens:

1. reach every node in parallel and check the runtime's program is there (``vllm`` for the
   venv runtime, ``docker`` and the same image on every node for the docker runtime, pinned to
   its digest); refuse if the deployment already runs on any node;
2. start the workers, then the leader (``RankPlan.in_start_order``), each in its own folder on
   its node with its own log file (``tandem.backends.runtimes``);
3. record state, then wait for readiness (``tandem.readiness``) while reading every rank's log
   over the shared ssh connection, recording phases as they are reached;
4. on failure stop every rank on every node, then raise the cause.

A rank counts as running while its process (venv) or container (docker) is alive on its node,
checked over ssh: a dead headless worker leaves the leader answering ``/health``, so health
alone would not see it. ``down`` stops every rank in parallel, copies the end of each rank's log
into the local state folder, and removes the ranks' temp folders on the nodes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tandem import agent, files
from tandem.backends.base import Look
from tandem.backends.launch import await_ready, launch_marked, new_state, record_rank
from tandem.backends.observation import (
    agent_request,
    answer_of,
    look_of,
    ranks_by_node,
)
from tandem.backends.openssh import OpenSSH, SSHTarget, engine_python
from tandem.backends.runtimes import (
    DockerRuntime,
    VenvRuntime,
    log_path,
    poll_script,
    resolve_runtime,
    tail_script,
)
from tandem.backends.state import (
    GroupState,
    Place,
    ProcessRecord,
    RankState,
)
from tandem.backends.sync import image_probe, parse_image
from tandem.errors import BackendError, SSHError
from tandem.interrupts import interruption
from tandem.rankplan import RankPlan, RankSpec
from tandem.readiness import Readiness
from tandem.redact import Redactor
from tandem.render.docker import container_name, image_of, is_pinned
from tandem.spec.cluster import Cluster, Runtime
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe

Runtimes = VenvRuntime | DockerRuntime


def runtime_for(cluster: Cluster, recipe: Recipe) -> Runtimes:
    """The runtime the cluster's ``ssh.runtime`` and the recipe's image select."""
    runtime = resolve_runtime(cluster.ssh, recipe.engine.image)
    if runtime is Runtime.DOCKER:
        return DockerRuntime(cluster.ssh, recipe.engine.image or "")
    return VenvRuntime(cluster.ssh)


def _reach(deployment: Deployment) -> tuple[OpenSSH, dict[str, SSHTarget], Runtimes]:
    """The ssh transport of a deployment's cluster, each node's target, and its runtime."""
    cluster = deployment.cluster
    targets = {node.name: SSHTarget.of(node) for node in cluster.nodes}
    return OpenSSH.for_cluster(cluster), targets, runtime_for(cluster, deployment.recipe)


def _launched(state: GroupState) -> tuple[Cluster, OpenSSH, dict[str, SSHTarget], Runtimes]:
    """The cluster a deployment was launched on and its ``_reach``, read leniently: an old state
    whose recipe today's checks refuse must still be stopped, watched and bundled."""
    deployment = state.deployment(lenient=True)
    return deployment.cluster, *_reach(deployment)


class RemoteLog:
    """Reads a remote rank's log incrementally, and its liveness, with one ssh call per poll.

    Satisfies ``readiness.WatchedRank`` and ``base.LogReader``. The first read starts at most
    ``first_bytes`` before the end, so a long log is not copied whole.
    """

    def __init__(
        self,
        ssh: OpenSSH,
        target: SSHTarget,
        runtime: Runtimes,
        deployment: str,
        rank: int,
        *,
        first_bytes: int = 4_000_000,
    ) -> None:
        self.rank = rank
        self.ssh, self.target, self.runtime = ssh, target, runtime
        self.deployment = deployment
        self.path = log_path(runtime.options, deployment, rank)
        self.offset: int | None = None
        self.first_bytes = first_bytes
        self.partial = b""
        self.status = "running"

    def _poll(self) -> list[str]:
        status = self.runtime.status_script(self.deployment, self.rank)
        if self.offset is None:  # first read: find the size, start near the end
            size = self.ssh.run(self.target, f"stat -c %s {self.path} 2>/dev/null || echo 0\n")
            self.offset = max(0, int(size.stdout.strip() or 0) - self.first_bytes)
        result = self.ssh.run(self.target, poll_script(status, self.path, self.offset))
        head, _, rest = result.raw.partition(b"\n")
        sizes, _, chunk = rest.partition(b"\n")
        self.status = head.decode(errors="replace").strip()
        _, used = sizes.split() if len(sizes.split()) == 2 else (b"0", b"0")
        if int(used) < self.offset:  # rotated by a restart
            self.partial = b""
        self.offset = int(used) + len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return [line.decode(errors="replace") for line in lines]

    def new_lines(self) -> list[str]:
        return self._poll()

    def exit_code(self) -> int | None:
        if not self.status.startswith("exited"):
            return None
        code = self.status.split()[-1]
        return int(code) if code.lstrip("-").isdigit() else -1

    def recent_text(self) -> str:
        return self.ssh.run(self.target, tail_script(self.path, 200), check=False).stdout


class SSHBackend:
    """``tandem.backends.base.Backend`` for the ``ssh`` transport."""

    name = "ssh"

    def launch_commands(
        self, plan: RankPlan, deployment: Deployment
    ) -> list[tuple[RankSpec, list[str]]]:
        """What runs on each node, in start order: ``ssh NODE`` followed by the rank's command."""
        ssh, targets, runtime = _reach(deployment)
        result = []
        for rank in plan.in_start_order():
            if isinstance(runtime, DockerRuntime):
                command = runtime.run_argv(rank, deployment)
            else:
                command = [
                    "env",
                    *(f"{k}={v}" for k, v in rank.env.items()),
                    *runtime.program().split(),
                    *rank.argv[1:],
                ]
            result.append((rank, ssh.argv(targets[rank.node], command)))
        return result

    # --- up ---------------------------------------------------------------------------------

    def up(
        self,
        plan: RankPlan,
        deployment: Deployment,
        *,
        timeout_s: float | None,
        on_phase=lambda mark: None,
        on_event=lambda text: None,
        place: Place | None = None,
    ) -> tuple[GroupState, Readiness]:
        """Launch every rank, workers first, and wait until the model answers.

        Raises:
            SSHError: a node is unreachable, refuses the key, or lacks vllm/docker.
            BackendError: already running, or the nodes hold different images.
            RankFailed: a rank exited or start-up timed out (every rank is stopped first).
        """
        cluster, name = deployment.cluster, deployment.name
        ssh, targets, runtime = _reach(deployment)
        on_event(f"reaching {len(targets)} node(s) over ssh, runtime {runtime.name.value}")
        self._preflight(ssh, targets, runtime, name)
        if isinstance(runtime, DockerRuntime):
            runtime = DockerRuntime(
                runtime.options, self._pin_image(ssh, targets, runtime, deployment, on_event)
            )
            recipe = deployment.recipe.model_copy(
                update={
                    "engine": deployment.recipe.engine.model_copy(update={"image": runtime.image})
                }
            )
            deployment = Deployment(recipe=recipe, cluster=cluster)
        place = place or Place(name)
        files.private_dir(place.directory.logs)
        state = new_state(plan, deployment, backend=self.name, place=place)
        state.save()
        watched: list[RemoteLog] = []
        try:
            for rank in plan.in_start_order():
                target = targets[rank.node]
                started = ssh.run(
                    target,
                    runtime.start_script(launch_marked(rank, state), deployment),
                    timeout_s=120,
                    program=runtime.program(),
                )
                if not started.ok:
                    raise BackendError(
                        f"could not start rank {rank.rank}: "
                        f"{started.stderr.strip() or started.stdout.strip()}",
                        node=rank.node,
                        rank=rank.rank,
                    )
                handle = started.stdout.strip().splitlines()[-1] if started.stdout.strip() else ""
                pid = int(handle) if handle.isdigit() else None
                record_rank(
                    state,
                    rank,
                    pid=pid,
                    log=f"{target.destination}:{log_path(runtime.options, name, rank.rank)}",
                )
                watched.append(RemoteLog(ssh, target, runtime, name, rank.rank, first_bytes=0))
                on_event(
                    f"started rank {rank.rank} ({rank.role.value}) on {rank.node} "
                    f"[{target.destination}], "
                    + (f"pid {pid}" if pid else f"container {container_name(name, rank.rank)}")
                )
            readiness = await_ready(
                plan, deployment, watched, state, timeout_s=timeout_s, on_phase=on_phase
            )
            self._record_processes(state, watched)
        except BaseException as exc:
            on_event(f"{interruption(exc) or 'start-up failed'}: stopping every rank on every node")
            self._stop_all(state, on_event=on_event)
            raise
        return state, readiness

    def _preflight(
        self, ssh: OpenSSH, targets: dict[str, SSHTarget], runtime: Runtimes, name: str
    ) -> None:
        program = runtime.program().split()[0]
        checks = {
            node: (
                t,
                f"command -v {program} >/dev/null 2>&1 || "
                f"{{ echo '{program}: command not found' >&2; exit 127; }}\n",
            )
            for node, t in targets.items()
        }
        ssh.run_all(checks, timeout_s=60)
        status = ssh.run_all(
            {
                f"{node}": (t, runtime.status_script(name, rank))
                for rank, (node, t) in enumerate(targets.items())
            },
            timeout_s=60,
        )
        running = [node for node, result in status.items() if result.stdout.startswith("running")]
        if running:
            raise BackendError(
                f"deployment '{name}' is already running on {', '.join(running)}",
                hint=f"stop it first with `tandem down {name}`",
            )

    def _pin_image(
        self,
        ssh: OpenSSH,
        targets: dict[str, SSHTarget],
        runtime: DockerRuntime,
        deployment: Deployment,
        on_event,
    ) -> str:
        """The image as ``repo@sha256:...`` (or its image id), the same on every node."""
        image = image_of(deployment)
        docker = runtime.options.docker_command
        script = image_probe(image, docker)
        found = {
            node: parse_image(node, r.stdout)
            for node, r in ssh.run_all(
                {node: (t, script) for node, t in targets.items()}, timeout_s=60
            ).items()
        }
        missing = sorted(node for node, held in found.items() if held.image_id is None)
        ids = {held.image_id for held in found.values() if held.image_id}
        if missing or len(ids) != 1:
            detail = (
                f"missing on {', '.join(missing)}"
                if missing
                else "different image ids: "
                + ", ".join(f"{n} {(held.image_id or '')[:19]}" for n, held in found.items())
            )
            raise BackendError(
                f"image {image} is not the same on every node ({detail})",
                field="engine.image",
                hint=f"run `tandem sync {deployment.name} --cluster FILE` to copy "
                "or pull it, then start again",
            )
        if is_pinned(image):
            return image
        digests = found[next(iter(found))].digests
        repo = image.rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
        pinned = next((d for d in digests if d.split("@")[0] == repo), None) or ids.pop()
        on_event(f"image {image} pinned to {pinned}")
        return pinned

    # --- down, status, logs ---------------------------------------------------------------

    def _stop_all(self, state: GroupState, *, on_event=lambda text: None) -> list[str]:
        """Stop every recorded rank (and any marked leftover) in parallel; return survivors."""
        cluster, ssh, targets, runtime = _launched(state)
        ranks = {r.rank: r.node for r in state.ranks}
        for i, node in enumerate(cluster.nodes):  # a rank that crashed before it was recorded
            ranks.setdefault(i, node.name)
        jobs = {
            rank: (targets[node], runtime.stop_script(state.name, rank, launch=state.launch_id))
            for rank, node in ranks.items()
        }
        results = ssh.run_all(jobs, timeout_s=90, check=False)
        leftovers = []
        for rank, result in results.items():
            survivors = result.stdout.rsplit("survivors:", 1)[-1].split()
            if survivors:
                leftovers.append(
                    f"rank {rank} on {ranks[rank]}: process(es) "
                    f"{' '.join(survivors)} survived SIGKILL"
                )
        on_event(
            f"stopped {len(ranks)} rank(s) of '{state.name}' on {len(set(ranks.values()))} node(s)"
        )
        return leftovers

    def _keep_logs(self, state: GroupState) -> None:
        """Copy the end of each rank's log into the local state folder."""
        _, ssh, targets, runtime = _launched(state)
        files.private_dir(state.directory.logs)
        results = ssh.run_all(
            {
                r.rank: (
                    targets[r.node],
                    tail_script(log_path(runtime.options, state.name, r.rank), 5000),
                )
                for r in state.ranks
            },
            timeout_s=60,
            check=False,
        )
        redactor = Redactor.for_caller()
        for rank, result in results.items():
            files.write_text(
                state.directory.rank_log(rank), result.stdout, redactor=redactor, private=True
            )

    def down(self, state: GroupState, *, on_event=lambda text: None) -> None:
        try:
            self._keep_logs(state)
        except SSHError as exc:
            on_event(f"could not copy the logs: {exc.message}")
        leftovers = self._stop_all(state, on_event=on_event)
        if leftovers:
            raise BackendError(
                f"could not stop everything of '{state.name}': {'; '.join(leftovers)}"
            )

    def rank_running(self, state: GroupState, rank: RankState) -> bool:
        """True while the rank's process or container is alive on its node."""
        _, ssh, targets, runtime = _launched(state)
        result = ssh.run(
            targets[rank.node], runtime.status_script(state.name, rank.rank), timeout_s=30
        )
        return result.stdout.startswith("running")

    def _record_processes(self, state: GroupState, watched: list[RemoteLog]) -> None:
        """Each rank's processes and log size at ready, the health model's base."""
        offsets = {w.rank: w.offset for w in watched}
        for rank, seen in self.observe(state).ranks.items():
            record = next(r for r in state.ranks if r.rank == rank)
            record.processes = [ProcessRecord(pid=p.pid, name=p.name) for p in seen.processes]
            record.log_offset_ready = offsets.get(rank)
        state.save()

    def observe(self, state: GroupState, *, nodes: bool = False) -> Look:
        """One call of the node agent a node, all nodes in parallel (``backends.observation``)."""
        cluster, ssh, targets, runtime = _launched(state)
        python = engine_python(cluster.ssh.vllm_command)
        source = agent.source()

        def ask(node: str, ranks: list[RankState]) -> dict | str:
            request = agent_request(
                state,
                ranks,
                lambda r: str(log_path(runtime.options, state.name, r.rank)),
                nodes=nodes,
            )
            try:
                done = ssh.run_python(
                    targets[node], source, [request], python=python, timeout_s=30, check=False
                )
            except SSHError as exc:  # one node down must not hide the others
                return exc.message
            return answer_of(done.returncode, done.stdout, done.stderr)

        by_node = ranks_by_node(state)
        with ThreadPoolExecutor(max_workers=max(1, len(by_node))) as pool:
            futures = {node: pool.submit(ask, node, ranks) for node, ranks in by_node.items()}
            answers = {node: future.result() for node, future in futures.items()}
        return look_of(state, answers, nodes=nodes)

    def log_reader(self, state: GroupState, rank: RankState) -> RemoteLog:
        _, ssh, targets, runtime = _launched(state)
        return RemoteLog(ssh, targets[rank.node], runtime, state.name, rank.rank)

    def node_versions(self, state: GroupState) -> dict[str, str]:
        """Kernel, Python and vLLM (venv) or docker and image (docker) of every node."""
        _, ssh, targets, runtime = _launched(state)
        if isinstance(runtime, DockerRuntime):
            what = (
                f"{runtime.options.docker_command} version --format "
                "'docker {{.Server.Version}}' 2>&1; echo image "
                f"'{state.deployment(lenient=True).recipe.engine.image}'"
            )
        else:
            # The version from the package metadata beside the vllm script: `vllm --version`
            # imports torch and takes tens of seconds.
            vllm = runtime.options.vllm_command
            what = (
                f'py=$(head -n 1 "$(command -v {vllm})" 2>/dev/null | '
                "sed -n 's/^#!\\(.*python[0-9.]*\\)$/\\1/p'); if [ -n \"$py\" ]; then "
                '"$py" -c \'from importlib.metadata import version; '
                'print("vllm", version("vllm"))\' 2>&1; '
                f'else echo "vllm $({vllm} --version 2>/dev/null | tail -n 1)"; fi'
            )
        script = f"uname -srm; python3 --version 2>&1 || true; {what}\n"
        with ThreadPoolExecutor() as pool:
            futures = {
                n: pool.submit(ssh.run, t, script, timeout_s=120, check=False)
                for n, t in targets.items()
            }
            return {n: f.result().stdout.strip() for n, f in futures.items()}
