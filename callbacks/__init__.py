"""Generic performance callbacks for PyTorch Lightning (torch + lightning + tensordict only).

They meet a LightningModule through a small duck-typed protocol (see ``callbacks._protocol``):
``hot_paths`` (methods ``TensorDict -> TensorDict`` such as ``update`` and ``act``), ``optimizer_kwargs``
(merged into every optimizer constructor) and optionally ``cuda_graph_safe``.

Recommended order in the callback list (hot-path wrappers wrap what is already there in ``on_fit_start``):
``NonBlockingTransfer, TF32, FusedOptimizer, DirectSteps, MixedPrecision, TorchCompile, CudaGraphs,
GPUMonitor, ThroughputMonitor, CudaCacheClearing``. ``CudaGraphs`` refuses to be listed before
``TorchCompile``.
"""

from callbacks.cuda_cache_clearing import CudaCacheClearing
from callbacks.cuda_graphs import CudaGraphs
from callbacks.direct_steps import DirectSteps
from callbacks.fused_optimizer import FusedOptimizer
from callbacks.gpu_monitor import GPUMonitor
from callbacks.mixed_precision import MixedPrecision
from callbacks.non_blocking_transfer import NonBlockingTransfer
from callbacks.tf32 import TF32
from callbacks.throughput_monitor import ThroughputMonitor
from callbacks.torch_compile import TorchCompile

__all__ = [
    "TF32",
    "CudaCacheClearing",
    "CudaGraphs",
    "DirectSteps",
    "FusedOptimizer",
    "GPUMonitor",
    "MixedPrecision",
    "NonBlockingTransfer",
    "ThroughputMonitor",
    "TorchCompile",
]
