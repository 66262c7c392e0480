"""Analytic cost model: a roofline per device kind, plus a per-kernel launch overhead.

The time of one operation on a device kind is

    launch_overhead_s + max(flops / (peak_flops[dtype] * compute_efficiency),
                            bytes_accessed / (memory_bandwidth * memory_efficiency))

the classic roofline with the peaks of the vendor data sheets scaled by an
achieved fraction. Matrix ops (matmul, convolution, attention) use the matrix
units (tensor cores) where the dtype has them; everything else uses the
vector units.

Choices, and why:

* Efficiency. Peaks are never reached over a whole step; GPUs get 0.7 of the
  compute peak and 0.8 of the bandwidth. One figure per kind keeps the model
  explainable; a measured profile (:mod:`placer.cost.profile`) removes the
  error it leaves.
* Launch overhead. Every kernel costs at least its launch and the GPU's
  minimum kernel duration (5 us); without it the thousands of tiny optimizer
  and elementwise ops of a step would cost nothing.
* Views (``view``, ``reshape``, ``transpose``, ``getitem``...) change tensor
  metadata only and launch no kernel: 0 s (:data:`VIEW_OPS`).
* Arithmetic on Python numbers (``_operator.*``, e.g. Adam's bias
  corrections) runs on the host. A GPU does not wait for it, since kernels
  launch asynchronously: 0 s. On a CPU the host is the device: it costs
  :attr:`DeviceSpec.host_op_s` (:func:`host_op`). So do the optimizer's step
  count and learning-rate reads (:func:`step_counter_nodes`).
* FP32 convolutions use TF32 on A100/H100 and FP32 matmuls do not, as in
  PyTorch's defaults (``cudnn.allow_tf32=True``, ``cuda.matmul.allow_tf32=False``);
  :func:`annotate`'s ``tf32_matmul=True`` lets matmuls use it too.

References
----------
S. Williams, A. Waterman, D. Patterson, "Roofline: an insightful visual
performance model for multicore architectures", CACM 52(4), 2009.

Examples
--------
>>> from placer.cost.analytic import node_time_s
>>> t = node_time_s("V100", 2 * 4096**3, 3 * 4096 * 4096 * 4, matrix=True)
>>> round(float(t) * 1e3, 2)   # a 4096^3 FP32 GEMM: compute-bound at 0.7 * 15.7 TFLOP/s
12.51
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ..errors import OptionError

if TYPE_CHECKING:
    from ..graph import OpGraph

__all__ = [
    "DeviceSpec",
    "DEVICE_SPECS",
    "VIEW_OPS",
    "MATRIX_OPS",
    "node_time_s",
    "annotate",
    "op_base_name",
    "normalise_dtype",
    "host_op",
    "step_counter_nodes",
    "STEP_COUNTER_PREFIX",
    "LR_PLACEHOLDER",
]

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one device kind.

    Attributes
    ----------
    kind : str
        The kind name used by clusters (``Device.kind``).
    name : str
        The product the figures describe.
    vector_flops : dict
        dtype -> peak FLOP/s of the vector (CUDA / SIMD) units.
    matrix_flops : dict
        dtype -> peak FLOP/s of the matrix units (tensor cores); dtypes absent here
        use ``vector_flops`` for matrix ops too. ``"tf32"`` is the TF32 tensor-core peak.
    memory_bandwidth : float
        Peak memory bandwidth in bytes per second.
    launch_overhead_s : float
        Minimum time of any kernel (launch plus minimum duration).
    compute_efficiency, memory_efficiency : float
        Achieved fraction of the peak FLOP/s and of the peak bandwidth.
    source : str
        Where the figures come from.
    tf32 : bool
        Whether FP32 convolutions use the TF32 tensor cores (PyTorch's default where they exist).
    host_op_s : float
        Time of an operation on Python numbers (:func:`host_op`), which the host
        runs: 0 on a GPU, which goes on with the kernels already queued meanwhile.
    """

    kind: str
    name: str
    vector_flops: dict[str, float]
    matrix_flops: dict[str, float]
    memory_bandwidth: float
    launch_overhead_s: float
    compute_efficiency: float
    memory_efficiency: float
    source: str
    tf32: bool = field(default=False)
    host_op_s: float = field(default=0.0)

    def peak_flops(self, dtype: str, matrix: bool) -> float:
        """Peak FLOP/s for ``dtype`` (normalised name or ``"tf32"``) on matrix or vector units."""
        if matrix and dtype in self.matrix_flops:
            return self.matrix_flops[dtype]
        if dtype == "tf32":
            dtype = "float32"
        return self.vector_flops.get(dtype, self.vector_flops["float32"])


_GPU_LAUNCH_S = 5e-6
_GPU_COMPUTE_EFF = 0.7
_GPU_MEMORY_EFF = 0.8

DEVICE_SPECS: dict[str, DeviceSpec] = {
    # NVIDIA Tesla V100 datasheet (SXM2, 2017/2020 revisions) and the Volta architecture
    # whitepaper: 15.7 TFLOP/s FP32, 7.8 FP64, 31.4 FP16 (vector, 2x FP32), 125 TFLOP/s FP16
    # tensor core, 900 GB/s HBM2. No BF16 hardware: BF16 runs at the FP32 rate.
    "V100": DeviceSpec(
        kind="V100",
        name="NVIDIA V100 SXM2",
        vector_flops={"float32": 15.7 * TERA, "float64": 7.8 * TERA, "float16": 31.4 * TERA, "bfloat16": 15.7 * TERA},
        matrix_flops={"float16": 125 * TERA},
        memory_bandwidth=900 * GIGA,
        launch_overhead_s=_GPU_LAUNCH_S,
        compute_efficiency=_GPU_COMPUTE_EFF,
        memory_efficiency=_GPU_MEMORY_EFF,
        source="NVIDIA Tesla V100 datasheet (SXM2): 15.7 TFLOP/s FP32, 125 TFLOP/s FP16 tensor, 900 GB/s",
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB) and the Ampere whitepaper table 1
    # (dense figures, no sparsity): 19.5 TFLOP/s FP32, 9.7 FP64 (19.5 FP64 tensor), 78 FP16 and
    # 39 BF16 vector, 156 TF32 tensor, 312 FP16/BF16 tensor; 1,555 GB/s HBM2.
    "A100": DeviceSpec(
        kind="A100",
        name="NVIDIA A100 SXM4 40GB",
        vector_flops={"float32": 19.5 * TERA, "float64": 9.7 * TERA, "float16": 78 * TERA, "bfloat16": 39 * TERA},
        matrix_flops={"tf32": 156 * TERA, "float16": 312 * TERA, "bfloat16": 312 * TERA, "float64": 19.5 * TERA},
        memory_bandwidth=1555 * GIGA,
        launch_overhead_s=_GPU_LAUNCH_S,
        compute_efficiency=_GPU_COMPUTE_EFF,
        memory_efficiency=_GPU_MEMORY_EFF,
        source="NVIDIA A100 datasheet (SXM4 40GB): 19.5 TFLOP/s FP32, 156 TF32, 312 FP16/BF16 dense, 1555 GB/s",
        tf32=True,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5) and the Hopper whitepaper (dense figures;
    # the datasheet's 989 TF32 / 1,979 FP16 are with 2:4 sparsity): 67 TFLOP/s FP32, 34 FP64
    # (67 FP64 tensor), 133.8 FP16/BF16 vector, 494.7 TF32 tensor, 989.4 FP16/BF16 tensor;
    # 3.35 TB/s HBM3.
    "H100": DeviceSpec(
        kind="H100",
        name="NVIDIA H100 SXM5 80GB",
        vector_flops={"float32": 67 * TERA, "float64": 34 * TERA, "float16": 133.8 * TERA, "bfloat16": 133.8 * TERA},
        matrix_flops={"tf32": 494.7 * TERA, "float16": 989.4 * TERA, "bfloat16": 989.4 * TERA, "float64": 67 * TERA},
        memory_bandwidth=3350 * GIGA,
        launch_overhead_s=_GPU_LAUNCH_S,
        compute_efficiency=_GPU_COMPUTE_EFF,
        memory_efficiency=_GPU_MEMORY_EFF,
        source="NVIDIA H100 datasheet (SXM5): 67 TFLOP/s FP32, 494.7 TF32 / 989.4 FP16 dense, 3.35 TB/s",
        tf32=True,
    ),
    # One AMD EPYC (Zen 4) core with one torch thread: each "cpu" device of the 2xcpu/4xcpu
    # presets is one process on one core. Achieved single-thread rates (bench/capture.py prints
    # the local machine's): sgemm near the AVX-512 peak, bf16 gemm faster (AVX512_BF16), fp16
    # slow (no native FP16 arithmetic). Out-of-place elementwise ops reach well under a copy's
    # bandwidth (fresh outputs are page-faulted in), hence the low memory efficiency. The launch
    # overhead is a tiny aten op's time run node by node from a captured graph, as profiles and
    # the runtime run it.
    "cpu": DeviceSpec(
        kind="cpu",
        name="AMD EPYC (Zen 4) core, 1 torch thread",
        vector_flops={"float32": 80 * GIGA, "float64": 33 * GIGA, "float16": 2 * GIGA, "bfloat16": 80 * GIGA},
        matrix_flops={"bfloat16": 200 * GIGA},
        memory_bandwidth=30 * GIGA,
        launch_overhead_s=5e-6,
        host_op_s=5e-6,
        compute_efficiency=0.8,
        memory_efficiency=0.3,
        source="measured on this machine (one Zen 4 core, torch 2.13, 1 thread)",
    ),
}

#: Ops that only change tensor metadata: no kernel, no time.
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "alias",
        "detach",
        "lift_fresh",
        "t",
        "transpose",
        "permute",
        "expand",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
        "as_strided",
        "unfold",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "narrow",
        "view_as",
        "expand_as",
        "getitem",
        "_reshape_alias",
        "diagonal",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "unsafe_split",
        "unsafe_split_with_sizes",
        "movedim",
        "numpy_T",
        "mT",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "placeholder",
        "output",
    }
)

#: Ops that run on matrix units (tensor cores) when the dtype has them.
MATRIX_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "addbmm",
        "addmv",
        "mv",
        "dot",
        "convolution",
        "convolution_backward",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "cudnn_convolution",
        "mkldnn_convolution",
        "_mkldnn_convolution",
        "conv_transpose2d",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "scaled_dot_product_attention",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
    }
)

_CONV_OPS = frozenset(o for o in MATRIX_OPS if "conv" in o)

_DTYPE_ALIASES = {
    "float": "float32",
    "float32": "float32",
    "fp32": "float32",
    "single": "float32",
    "half": "float16",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "double": "float64",
    "float64": "float64",
    "fp64": "float64",
    "tf32": "tf32",
}


def op_base_name(op: str | None) -> str:
    """``"aten.mm.default"``, ``"aten::mm"``, ``"aten.mm"`` and ``"mm"`` all give ``"mm"``.

    Returns ``""`` for ``None``.
    """
    if not op:
        return ""
    name = op.replace("::", ".")
    parts = name.split(".")
    if parts[0] in ("aten", "prims", "torch", "operator", "_operator") and len(parts) > 1:
        parts = parts[1:]
    return parts[0]


def host_op(op: str | None) -> bool:
    """Whether ``op`` is arithmetic on Python numbers (``"_operator.pow"``), which runs on the host.

    Picking an output of a multi-output op (``_operator.getitem``) is no arithmetic: a view.

    >>> host_op("_operator.pow"), host_op("aten.pow.Tensor_Scalar"), host_op("_operator.getitem")
    (True, False, False)
    """
    return bool(op) and op.replace("::", ".").startswith(("_operator.", "operator.")) and op_base_name(op) != "getitem"


#: Prefix of the placeholders that hold an optimizer's step count in a captured step
#: (``s_<state>_<param>``, :mod:`placer.capture.trace`).
STEP_COUNTER_PREFIX = "s_step_"

#: The name of the placeholder that holds a captured step's learning rate (:mod:`placer.capture.trace`).
LR_PLACEHOLDER = "lr"


def step_counter_nodes(graph: OpGraph) -> np.ndarray:
    """The nodes that only count the optimizer's steps or read its learning rate: host work, as :func:`host_op`.

    ``torch.optim.Adam`` (neither capturable nor fused) keeps ``state["step"]``
    as a CPU tensor, so ``step += 1``, its write-back and the ``.item()`` that
    feeds the bias corrections launch no GPU kernel; the learning rate is a
    Python number read with one ``.item()`` per step. These nodes are those
    reached from a step-count or learning-rate placeholder through scalar
    outputs (8 bytes at most); the first node with a larger output (the update
    that reads the bias correction) is not one.
    """
    out = np.zeros(graph.num_nodes, dtype=bool)
    stack = [
        i
        for i, name in enumerate(graph.ids)
        if graph.op[i] == "placeholder" and (name.startswith(STEP_COUNTER_PREFIX) or name == LR_PLACEHOLDER)
    ]
    ptr, eids = graph.out_edges
    while stack:
        v = stack.pop()
        for w in graph.dst[eids[ptr[v] : ptr[v + 1]]].tolist():
            if not out[w] and graph.output_bytes[w] <= 8:
                out[w] = True
                stack.append(w)
    return out


def normalise_dtype(dtype: str | None) -> str:
    """``"torch.float16"`` -> ``"float16"``; integer and boolean dtypes count as float32 work."""
    if not dtype:
        return "float32"
    name = str(dtype).removeprefix("torch.").lower()
    return _DTYPE_ALIASES.get(name, "float32")


def _spec(kind: str) -> DeviceSpec:
    try:
        return DEVICE_SPECS[kind]
    except KeyError:
        raise OptionError(
            f"unknown device kind {kind!r} for the analytic model (known: {', '.join(DEVICE_SPECS)})"
        ) from None


def node_time_s(
    kind: str,
    flops,
    bytes_accessed,
    dtype: "str | Sequence[str]" = "float32",
    matrix: "bool | Sequence[bool]" = False,
    views=False,
    host=False,
) -> np.ndarray:
    """Roofline time of operations on one device kind (vectorised over operations).

    Parameters
    ----------
    kind : str
        A key of :data:`DEVICE_SPECS` (``"V100"``, ``"A100"``, ``"H100"``, ``"cpu"``).
    flops, bytes_accessed : float or array-like
        FLOPs and bytes read plus written per operation; NaN counts as 0.
    dtype : str or sequence of str
        The operations' dtype (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``,
        ``"tf32"``; ``torch.`` prefixes and aliases accepted), one for all or one each.
    matrix : bool or sequence of bool
        Whether each operation may use the matrix units (see :data:`MATRIX_OPS`).
    views : bool or sequence of bool
        Metadata-only operations, which cost 0 s.
    host : bool or sequence of bool
        Operations on Python numbers (:func:`host_op`), which cost the kind's ``host_op_s``.

    Returns
    -------
    numpy.ndarray
        Seconds per operation (a 0-d array for scalar inputs).

    Raises
    ------
    OptionError
        If ``kind`` is not a known device kind.

    Examples
    --------
    >>> float(node_time_s("A100", 0.0, 1555e9 * 0.8 * 1e-3))  # 1 ms of memory traffic + launch
    0.001005
    """
    spec = _spec(kind)
    flops = np.nan_to_num(np.asarray(flops, dtype=np.float64), nan=0.0)
    nbytes = np.nan_to_num(np.asarray(bytes_accessed, dtype=np.float64), nan=0.0)
    flops, nbytes = np.broadcast_arrays(flops, nbytes)
    matrix_arr = np.broadcast_to(np.asarray(matrix, dtype=bool), flops.shape)
    dtypes = np.broadcast_to(
        np.asarray(
            [normalise_dtype(d) for d in np.atleast_1d(dtype)] if not isinstance(dtype, str) else normalise_dtype(dtype)
        ),
        flops.shape,
    )
    peak = np.empty(flops.shape)
    for d in np.unique(dtypes):
        for m in (False, True):
            sel = (dtypes == d) & (matrix_arr == m)
            peak[sel] = spec.peak_flops(str(d), m)
    time = spec.launch_overhead_s + np.maximum(
        flops / (peak * spec.compute_efficiency), nbytes / (spec.memory_bandwidth * spec.memory_efficiency)
    )
    time = np.where(np.broadcast_to(np.asarray(host, dtype=bool), flops.shape), spec.host_op_s, time)
    return np.where(np.broadcast_to(np.asarray(views, dtype=bool), flops.shape), 0.0, time)


def _node_bytes(graph: "OpGraph") -> np.ndarray:
    """Bytes accessed per node: ``node_extra["bytes_accessed"]``, else inputs plus output."""
    in_bytes = np.bincount(graph.dst, weights=graph.edge_bytes.astype(np.float64), minlength=graph.num_nodes)
    fallback = in_bytes + graph.output_bytes
    given = np.array([float(e.get("bytes_accessed", np.nan)) for e in graph.node_extra])
    return np.where(np.isnan(given), fallback, given)


#: The kind the cluster presets give speed 1.0: ``compute_s`` holds its times unless told otherwise.
PRESET_REFERENCE = "V100"


def annotate(
    graph: "OpGraph",
    *,
    reference: str = PRESET_REFERENCE,
    kinds: Iterable[str] | None = None,
    tf32_matmul: bool = False,
) -> "OpGraph":
    """A copy of ``graph`` costed by the roofline model.

    Parameters
    ----------
    graph : OpGraph
        Nodes carry ``flops``, ``op`` and ``node_extra["bytes_accessed"]`` / ``["dtype"]``
        (as :mod:`placer.capture` writes them). A node without ``bytes_accessed`` counts
        its input edges plus its output; a node without ``dtype`` is float32.
    reference : str
        Kind whose times become ``compute_s`` (the speed-1.0 kind of the cluster presets).
    kinds : iterable of str, optional
        Other kinds whose times go into ``compute_s_by_kind`` (these kinds are
        overwritten, others kept). By default every kind of :data:`DEVICE_SPECS`,
        so that a device of any preset runs at its own kind's speed rather than
        the reference's times scaled by its ``speed``.
    tf32_matmul : bool
        Let FP32 matmuls use TF32 tensor cores too (``torch.backends.cuda.matmul.allow_tf32``);
        FP32 convolutions always do, as in PyTorch's defaults.

    Returns
    -------
    OpGraph

    Raises
    ------
    OptionError
        If a kind is unknown.

    References
    ----------
    Williams, Waterman, Patterson, "Roofline", CACM 52(4), 2009. Vendor data sheets cited
    in :data:`DEVICE_SPECS`.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = annotate(training_graph(layers=2), kinds=("A100",))
    >>> sorted(g.compute_s_by_kind[0])
    ['A100']
    """
    kinds = [k for k in dict.fromkeys(DEVICE_SPECS if kinds is None else kinds) if k != reference]
    for kind in [reference, *kinds]:
        _spec(kind)
    bases = [op_base_name(op) for op in graph.op]
    views = np.array([b in VIEW_OPS for b in bases], dtype=bool)
    host = np.array([host_op(op) for op in graph.op], dtype=bool) | step_counter_nodes(graph)
    matrix = np.array([b in MATRIX_OPS for b in bases], dtype=bool)
    conv = np.array([b in _CONV_OPS for b in bases], dtype=bool)
    dtypes = np.array([normalise_dtype(e.get("dtype")) for e in graph.node_extra])
    nbytes = _node_bytes(graph)

    def times(kind: str) -> np.ndarray:
        use_tf32 = DEVICE_SPECS[kind].tf32 & (dtypes == "float32") & matrix & (conv | tf32_matmul)
        return node_time_s(kind, graph.flops, nbytes, np.where(use_tf32, "tf32", dtypes), matrix, views, host)

    compute_s = times(reference)
    by_kind = [dict(d) if d else {} for d in graph.compute_s_by_kind]
    for kind in kinds:
        for i, t in enumerate(times(kind).tolist()):
            by_kind[i][kind] = t
    return graph.replace(compute_s=compute_s, compute_s_by_kind=[d or None for d in by_kind])
