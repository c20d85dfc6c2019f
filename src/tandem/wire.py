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
VLLM_ENGINE_READY_TIMEOUT_S = "VLLM_ENGINE_READY_TIMEOUT_S"
VLLM_API_KEY = "VLLM_API_KEY"

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

# Variables that describe one node and so belong in the cluster inventory, not the recipe.
PER_NODE_VARS = (VLLM_HOST_IP,)

# --- where containers see the Hugging Face cache (seed 000's hostPath mount) -------------------
CONTAINER_HF_HOME = "/cache/huggingface"
