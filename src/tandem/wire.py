"""Wire names in one place: environment variables, labels and files that other programs read.

A name here is spelled exactly as vLLM, NCCL, Gloo, Hugging Face or LeaderWorkerSet spell it,
so a search for the real name finds every use in tandem.
"""

# --- vLLM ---------------------------------------------------------------------------------
VLLM_HOST_IP = "VLLM_HOST_IP"
"""The address this rank advertises to the others. Unset inside a namespace, vLLM falls back to
0.0.0.0 and the rendezvous hangs silently; on a multi-NIC host it guesses from the default route."""
VLLM_CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
"""GiB of KV cache per worker on the CPU backend."""
VLLM_CPU_OMP_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
"""CPU cores a CPU worker binds to, e.g. `0` or `0|1` for two local workers."""
VLLM_ALLOW_LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
"""`1` lets max_model_len exceed the model's own longest context (seed 002 sets it)."""
VLLM_API_KEY = "VLLM_API_KEY"
"""The key `vllm serve` requires as a bearer token when set; `tandem up` passes tandem's own value
to the leader, and every client command (readiness, chat, bench, eval) sends the same one."""


# `vllm serve`'s multi-node flags: tandem.rankplan writes them, a recipe may not (RESERVED_FLAGS),
# and the Kubernetes renderer replaces their values with LeaderWorkerSet's variables.
NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
MASTER_ADDR_FLAG = "--master-addr"
MASTER_PORT_FLAG = "--master-port"
HEADLESS_FLAG = "--headless"
"""A rank above 0 runs no API server and no scheduler, only its workers."""

RANK_OWNED_PREFIXES = (
    "VLLM_",
    "NCCL_",
    "GLOO_",
    "TP_SOCKET",
    "TANDEM_",
    "MASTER_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)
"""The caller's variables a rank (or a fabric-test rank) never inherits: the rank plan sets its
own, and a stray ``NCCL_SOCKET_IFNAME`` or ``RANK`` from the caller's shell would fight them."""
KEPT_HOST_VARS = ("NCCL_NVLS_ENABLE",)
"""Host-level safety switches kept from the caller all the same (NVLink multicast off on shared
hosts)."""


def bearer(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header for an OpenAI-compatible server (empty without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# the routes of vLLM's OpenAI-compatible server that tandem calls (tandem.endpoint is the client)
HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
METRICS_PATH = "/metrics"
VERSION_PATH = "/version"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where vLLM puts a reasoning model's thinking: ``reasoning`` since 0.10, ``reasoning_content``
before (and the DeepSeek API); a message or a stream delta carries one of them."""


# --- compile, JIT and autotune caches (tandem.caches keeps them per deployment and rank) -----
VLLM_CACHE_ROOT = "VLLM_CACHE_ROOT"
"""vLLM's cache root (vllm/envs.py, default ``~/.cache/vllm``): ``torch_compile_cache/HASH/
rank_R_D/`` with the Inductor and Triton artifacts of its own compiles, the FlashInfer autotune
cache (``flashinfer_autotune_cache/``), DeepGEMM's JIT (``deep_gemm/``, unless
``DG_JIT_CACHE_DIR`` is set) and model info."""
TORCHINDUCTOR_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
"""torch Inductor's cache (torch/_inductor/runtime/cache_dir_utils.py, default
``$TMPDIR/torchinductor_USER``); vLLM points it inside its compile cache while it compiles, so
this one holds what torch compiles outside vLLM's own graphs."""
TRITON_CACHE_DIR = "TRITON_CACHE_DIR"
"""Triton's kernel cache (triton/knobs.py, default ``~/.triton/cache``); vLLM keeps a caller's
value and otherwise puts it beside its Inductor cache."""
FLASHINFER_WORKSPACE_BASE = "FLASHINFER_WORKSPACE_BASE"
"""The base FlashInfer appends ``.cache/flashinfer/`` to for its JIT-built ops and cubins
(flashinfer/jit/env.py, default the home folder)."""
DG_JIT_CACHE_DIR = "DG_JIT_CACHE_DIR"
"""DeepGEMM's JIT kernel cache (read by deep_gemm; vLLM sets ``VLLM_CACHE_ROOT/deep_gemm`` when
it is unset, vllm/utils/deep_gemm.py)."""
TILELANG_CACHE_DIR = "TILELANG_CACHE_DIR"
"""TileLang's compile and autotuner cache (tilelang/env.py, default ``~/.tilelang/cache``)."""
CONTAINER_CACHE_ROOT = "/cache/tandem"
"""Where a container rank sees its node's compile cache root (docker volume, k8s hostPath)."""

# --- Hugging Face -------------------------------------------------------------------------
HF_HOME = "HF_HOME"
HF_HUB_OFFLINE = "HF_HUB_OFFLINE"

# --- NCCL data plane ------------------------------------------------------------------------
NCCL_NET = "NCCL_NET"
NCCL_IB_DISABLE = "NCCL_IB_DISABLE"
NCCL_IB_HCA = "NCCL_IB_HCA"
NCCL_IB_MERGE_NICS = "NCCL_IB_MERGE_NICS"
NCCL_IB_GID_INDEX = "NCCL_IB_GID_INDEX"
NCCL_IB_ADDR_FAMILY = "NCCL_IB_ADDR_FAMILY"
NCCL_IB_ROCE_VERSION_NUM = "NCCL_IB_ROCE_VERSION_NUM"
NCCL_CROSS_NIC = "NCCL_CROSS_NIC"

# --- control plane: all three selectors must name the same interface -------------------------
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
TP_SOCKET_IFNAME = "TP_SOCKET_IFNAME"
CONTROL_PLANE_VARS = (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME)

# --- tandem's own marks on the processes it starts -------------------------------------------
TANDEM_DEPLOYMENT = "TANDEM_DEPLOYMENT"
"""Set on every rank process; `tandem down` finds stray processes of a deployment by it."""
TANDEM_RANK = "TANDEM_RANK"
TANDEM_LAUNCH = "TANDEM_LAUNCH"
"""A random id per `tandem up`, kept in the state: `down` stops only processes of its own launch,
never a process that merely carries the same deployment name."""
SPT_NOENV = "SPT_NOENV"
"""setproctitle (which vLLM uses to rename its EngineCore and Worker processes) overwrites the
memory `/proc/PID/environ` shows unless this is set; with it the marks above stay readable."""

# Variables that describe one node and so belong in the cluster inventory, not the recipe.
PER_NODE_VARS = (VLLM_HOST_IP,)

# --- where containers see the Hugging Face cache (seed 000's hostPath mount) -------------------
CONTAINER_HF_HOME = "/cache/huggingface"

# --- LeaderWorkerSet (kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go) -----
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
"""Injected into every container: the leader pod's DNS name,
``<lws-name>-<groupIndex>.<subdomain>.<namespace>``,
e.g. ``deepseek-v4-flash-dspark-0.deepseek-v4-flash-dspark.default``."""
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
"""Injected: pods per group, leader included (= ``--nnodes``)."""
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
"""Injected: 0 for the leader, 1..size-1 for the workers (= ``--node-rank``)."""
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""Label on every pod of a LeaderWorkerSet: its name."""
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
ROLE_LABEL = "role"
"""Pod template label ``role: leader`` / ``role: worker``; the Service selects ``role: leader``
(the convention of LWS's own vLLM example and of seed 000)."""
K8S_HOSTNAME_LABEL = "kubernetes.io/hostname"
"""Node label that a cluster inventory's node ``name`` must equal (nodeSelector per role)."""
K8S_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
K8S_NAME_LABEL = "app.kubernetes.io/name"
CILIUM_LB_IPAM_IPS = "io.cilium/lb-ipam-ips"
"""Service annotation: the address Cilium LB-IPAM assigns a LoadBalancer Service (seed 000)."""
NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource the NVIDIA device plugin (GPU Operator) advertises on each node."""


# --- tandem's own Prometheus series (`tandem watch --serve-metrics`, tandem.watch.exporter) -----
# Family names as prometheus_client takes them: a counter is exposed with `_total` appended.
# Labels: deployment, node, rank, role, gpu, device, port, verdict. The Grafana dashboards and
# rules (tandem.render) query them by these names.
TANDEM_SAMPLE_TIMESTAMP = "tandem_watch_sample_timestamp_seconds"
TANDEM_VERDICT = "tandem_deployment_verdict"
"""1 for the current verdict (label `verdict`), 0 for the others."""
TANDEM_RESTARTS = "tandem_restarts"
TANDEM_RANK_UP = "tandem_rank_up"
TANDEM_RANK_PROCESSES = "tandem_rank_processes"
TANDEM_RANK_RSS = "tandem_rank_resident_memory_bytes"
TANDEM_RANK_CPU = "tandem_rank_cpu_seconds"
TANDEM_NODE_MEMORY_TOTAL = "tandem_node_memory_total_bytes"
TANDEM_NODE_MEMORY_AVAILABLE = "tandem_node_memory_available_bytes"
TANDEM_NODE_OOM_KILLS = "tandem_node_oom_kills"
TANDEM_GPU_TEMPERATURE = "tandem_gpu_temperature_celsius"
TANDEM_GPU_SM_CLOCK = "tandem_gpu_sm_clock_hertz"
TANDEM_GPU_POWER = "tandem_gpu_power_watts"
TANDEM_GPU_THROTTLED = "tandem_gpu_throttled"
TANDEM_RDMA_TRANSMIT = "tandem_rdma_transmit_bytes"
TANDEM_RDMA_RECEIVE = "tandem_rdma_receive_bytes"
TOTAL = "_total"
"""What Prometheus' exposition appends to a counter's family name."""
