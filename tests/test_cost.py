"""placer.cost: analytic roofline, measured profiles, calibration, Standard Evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from placer.cluster import load_cluster
from placer.cost.analytic import DEVICE_SPECS, annotate, node_time_s, op_base_name
from placer.errors import OptionError
from placer.graph import OpGraph

# ---------------------------------------------------------------- analytic


def test_compute_bound_gemm_on_v100():
    flops, nbytes = 2 * 4096.0**3, 3 * 4096 * 4096 * 4
    expected = 5e-6 + flops / (15.7e12 * 0.7)
    assert float(node_time_s("V100", flops, nbytes, matrix=True)) == pytest.approx(expected, rel=1e-12)


def test_memory_bound_op_uses_bandwidth():
    nbytes = 1e9
    assert float(node_time_s("H100", 1e6, nbytes)) == pytest.approx(5e-6 + nbytes / (3.35e12 * 0.8), rel=1e-12)


def test_dtype_and_matrix_units_pick_the_peak():
    flops = 1e12
    a100 = DEVICE_SPECS["A100"]
    fp16_matrix = float(node_time_s("A100", flops, 0, "torch.float16", matrix=True))
    fp16_vector = float(node_time_s("A100", flops, 0, "float16", matrix=False))
    tf32 = float(node_time_s("A100", flops, 0, "tf32", matrix=True))
    assert fp16_matrix == pytest.approx(5e-6 + flops / (312e12 * 0.7))
    assert fp16_vector == pytest.approx(5e-6 + flops / (78e12 * 0.7))
    assert tf32 == pytest.approx(5e-6 + flops / (156e12 * 0.7))
    # TF32 on vector units is FP32 work; V100 has no TF32 and no BF16 hardware.
    assert float(node_time_s("V100", flops, 0, "tf32", matrix=True)) == pytest.approx(5e-6 + flops / (15.7e12 * 0.7))
    assert float(node_time_s("V100", flops, 0, "bfloat16")) == float(node_time_s("V100", flops, 0, "float32"))
    assert a100.peak_flops("int64", False) == a100.vector_flops["float32"]


def test_vectorised_over_nodes_with_views_and_nan():
    t = node_time_s("V100", [np.nan, 0.0, 1e9], [0, 0, 0], ["float32", "float16", "float32"],
                    matrix=[False, False, True], views=[True, False, False])
    assert t.shape == (3,)
    assert t[0] == 0.0  # a view launches nothing
    assert t[1] == pytest.approx(5e-6)  # an empty kernel still costs its launch
    assert t[2] == pytest.approx(5e-6 + 1e9 / (15.7e12 * 0.7))


def test_unknown_kind_is_an_option_error():
    with pytest.raises(OptionError, match="TPUv4"):
        node_time_s("TPUv4", 1.0, 1.0)
    with pytest.raises(OptionError, match="TPUv4"):
        annotate(_hand_graph(), kinds=("TPUv4",))


def test_op_names_normalise():
    assert {op_base_name(x) for x in ("aten.mm.default", "aten::mm", "aten.mm", "mm")} == {"mm"}
    assert op_base_name(None) == ""


def _hand_graph() -> OpGraph:
    # conv (fp32 -> TF32 on A100), mm (fp32 stays FP32), view (free), relu (no bytes_accessed:
    # falls back to input edges + output), add in fp16.
    extra = [{"bytes_accessed": 4e6, "dtype": "float32"}, {"bytes_accessed": 8e6, "dtype": "torch.float32"},
             {"bytes_accessed": 0}, {}, {"bytes_accessed": 3e6, "dtype": "float16"}]
    return OpGraph(["conv", "mm", "view", "relu", "add"], [1, 1, 1, 1, 1], [0, 1, 2, 3], [1, 2, 3, 4],
                   [1000, 2000, 2000, 3000], output_bytes=[1000, 2000, 2000, 5000, 10],
                   flops=[2e12, 1e12, np.nan, 0.0, 1e6],
                   op=["aten.convolution.default", "aten.mm.default", "aten.view.default",
                       "aten.relu.default", "aten.add.Tensor"],
                   node_extra=extra, compute_s_by_kind=[{"cpu": 0.5}, None, None, None, None], name="hand")


def test_annotate_fills_reference_and_other_kinds():
    g = annotate(_hand_graph(), reference="V100", kinds=("A100", "H100", "V100"))
    eff, launch = 0.7, 5e-6
    assert g.compute_s[0] == pytest.approx(launch + 2e12 / (15.7e12 * eff))
    assert g.compute_s_by_kind[0]["A100"] == pytest.approx(launch + 2e12 / (156e12 * eff))  # TF32 conv
    assert g.compute_s_by_kind[1]["A100"] == pytest.approx(launch + 1e12 / (19.5e12 * eff))  # FP32 mm
    assert g.compute_s_by_kind[0]["cpu"] == 0.5  # other kinds' entries are kept
    assert "V100" not in g.compute_s_by_kind[0]  # the reference lives in compute_s
    assert g.compute_s[2] == 0.0 and g.compute_s_by_kind[2] == {"A100": 0.0, "H100": 0.0}
    relu_bytes = 2000 + 5000  # incoming edge + own output
    assert g.compute_s[3] == pytest.approx(launch + relu_bytes / (900e9 * 0.8))
    assert g.compute_s_by_kind[4]["H100"] == pytest.approx(launch + 3e6 / (3.35e12 * 0.8))
    tf32_mm = annotate(_hand_graph(), kinds=("A100",), tf32_matmul=True)
    assert tf32_mm.compute_s_by_kind[1]["A100"] == pytest.approx(launch + 1e12 / (156e12 * eff))


def test_annotated_graph_durations_on_presets():
    g = annotate(_hand_graph(), kinds=("A100", "H100"))
    d = g.durations(load_cluster("4xA100-nvlink"))
    np.testing.assert_allclose(d[:, 0], [g.compute_s_by_kind[i]["A100"] for i in range(5)])
    assert np.all(g.durations(load_cluster("8xH100-nvswitch"))[:, 0] <= g.compute_s + 1e-15)
