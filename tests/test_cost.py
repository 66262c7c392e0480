"""placer.cost: analytic roofline, measured profiles, calibration, Standard Evaluation."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from placer.cluster import Cluster, load_cluster
from placer.cost.analytic import DEVICE_SPECS, annotate, node_time_s, op_base_name
from placer.errors import OptionError
from placer.graph import OpGraph

from .processes import outliving, terminate_once_ranks_run

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
    t = node_time_s(
        "V100",
        [np.nan, 0.0, 1e9],
        [0, 0, 0],
        ["float32", "float16", "float32"],
        matrix=[False, False, True],
        views=[True, False, False],
    )
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
    extra = [
        {"bytes_accessed": 4e6, "dtype": "float32"},
        {"bytes_accessed": 8e6, "dtype": "torch.float32"},
        {"bytes_accessed": 0},
        {},
        {"bytes_accessed": 3e6, "dtype": "float16"},
    ]
    return OpGraph(
        ["conv", "mm", "view", "relu", "add"],
        [1, 1, 1, 1, 1],
        [0, 1, 2, 3],
        [1, 2, 3, 4],
        [1000, 2000, 2000, 3000],
        output_bytes=[1000, 2000, 2000, 5000, 10],
        flops=[2e12, 1e12, np.nan, 0.0, 1e6],
        op=["aten.convolution.default", "aten.mm.default", "aten.view.default", "aten.relu.default", "aten.add.Tensor"],
        node_extra=extra,
        compute_s_by_kind=[{"cpu": 0.5}, None, None, None, None],
        name="hand",
    )


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


def test_annotate_costs_every_known_kind_by_default_so_cpu_presets_run_at_cpu_speed():
    g = annotate(_hand_graph())
    assert set(g.compute_s_by_kind[1]) == set(DEVICE_SPECS) - {"V100"}
    on_cpu = g.durations(load_cluster("2xcpu"))[:, 0]
    np.testing.assert_allclose(on_cpu[1:], [g.compute_s_by_kind[i]["cpu"] for i in range(1, 5)])
    assert on_cpu[1] > 50 * g.compute_s[1]  # a matrix product on one core, not at the V100's speed


def test_annotated_graph_durations_on_presets():
    g = annotate(_hand_graph(), kinds=("A100", "H100"))
    d = g.durations(load_cluster("4xA100-nvlink"))
    np.testing.assert_allclose(d[:, 0], [g.compute_s_by_kind[i]["A100"] for i in range(5)])
    assert np.all(g.durations(load_cluster("8xH100-nvswitch"))[:, 0] <= g.compute_s + 1e-15)


# -------------------------------------------------------------- calibration
from placer.errors import FormatError, PlacerError  # noqa: E402
from placer.harness.calibrate import (  # noqa: E402
    LOADED_MESSAGES,
    MESSAGE_GAPS,
    Calibration,
    LinkFit,
    apply_calibration,
    calibrate,
    fit_link,
    load_calibration,
    measure_gloo,
    measure_probe,
)
from placer.sim.messages import MessageCost, cluster_message_cost  # noqa: E402


def test_fit_recovers_latency_and_bandwidth_exactly():
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7, 1e8])
    fit = fit_link(sizes, 2.5e-5 + sizes / 7.5e9, "synthetic")
    assert fit.latency_s == pytest.approx(2.5e-5, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(7.5e9, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    np.testing.assert_allclose(fit.predict(sizes), 2.5e-5 + sizes / 7.5e9)


def test_fit_of_noisy_points_has_r2_below_one():
    rng = np.random.default_rng(0)
    sizes = np.repeat([1e3, 1e5, 1e7], 4)
    times = (1e-5 + sizes / 1e9) * rng.uniform(0.7, 1.3, sizes.size)
    fit = fit_link(sizes, times)
    assert 0.0 < fit.r2 < 1.0
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.3)


@pytest.mark.parametrize(
    "sizes, times, message",
    [
        ([1e3, 1e3], [1e-5, 2e-5], "two distinct sizes"),
        ([1e3, 1e6], [1e-5, -1.0], "finite and > 0"),
        ([1e3, 1e6], [1e-3, 1e-5], "does not grow"),
    ],
)
def test_fit_refuses_unusable_points(sizes, times, message):
    with pytest.raises(PlacerError, match=message):
        fit_link(sizes, times, "pcie")


def _calibration() -> Calibration:
    messages = [(0, 1, 1024, 2e-5, 1e-5), (0, 1, 1 << 20, 3e-4, 5e-5)]
    return Calibration(
        {"gloo": LinkFit(3e-5, 4e9, 0.99, [(1024, 3.1e-5), (1 << 20, 2.9e-4)]), "cuda-peer": LinkFit(-1e-6, 2e11, 0.9)},
        {"backend": "gloo"},
        replace(MessageCost.fit(messages), by_gap=((0.0, 5e-6, 4e-6), (1e-3, 1e-5, 8e-6))),
        messages,
        barrier_s=2e-4,
        collectives={
            "all_reduce": LinkFit(2e-4, 1.5e9, 0.9, [(1024, 2e-4), (16 << 20, 1.1e-2)]),
            "all_gather": LinkFit(3e-4, 0.8e9, 0.9, [(1024, 3e-4), (16 << 20, 2.1e-2)]),
        },
    )


def test_calibration_round_trip_and_apply(tmp_path):
    path = tmp_path / "cal.json"
    _calibration().save(path)
    cal = load_calibration(path)
    assert cal.links["gloo"].samples == [(1024, 3.1e-5), (1 << 20, 2.9e-4)]
    assert cal.meta == {"backend": "gloo"}
    assert cal.message_cost == _calibration().message_cost and cal.message_samples == _calibration().message_samples
    assert cal.barrier_s == _calibration().barrier_s == 2e-4
    assert cal.collectives == _calibration().collectives
    assert cal.message_cost.send_s(1024) == pytest.approx(2e-5)
    assert cal.message_cost.send_s(1024, 1e-3) == pytest.approx(1e-5 + 1024 * cal.message_cost.send_per_byte_s)
    cluster = apply_calibration(load_cluster("2xcpu"), cal)
    assert {(ch.latency_s, ch.bandwidth_bytes_per_s) for ch in cluster.channels} == {(3e-5, 4e9)}
    assert cluster.transfer_s(0, 1, 4e9) == pytest.approx(1.0 + 3e-5)
    # The collectives measured over gloo go with its channels (on the ranks the calibration ran, 2 by default),
    # and tell the cluster from the preset calibrated without them.
    assert all(
        ch.extra["collectives"]
        == {
            "ranks": 2,
            "all_reduce": {"latency_s": 2e-4, "bandwidth_bytes_per_s": 1.5e9},
            "all_gather": {"latency_s": 3e-4, "bandwidth_bytes_per_s": 0.8e9},
        }
        for ch in cluster.channels
    )
    without = apply_calibration(load_cluster("2xcpu"), replace(cal, collectives={}))
    assert not any("collectives" in ch.extra for ch in without.channels)
    assert without.digest() != cluster.digest()
    # So does a message's host cost, on the cluster: it survives the cluster file, and counts in the digest.
    assert cluster_message_cost(cluster) == cal.message_cost
    assert cluster_message_cost(Cluster.from_dict(cluster.to_dict())) == cal.message_cost
    no_messages = apply_calibration(load_cluster("2xcpu"), replace(cal, message_cost=None))
    assert cluster_message_cost(no_messages) is None and cluster_message_cost(load_cluster("2xcpu")) is None
    assert no_messages.digest() != cluster.digest()
    # Named as its own cluster (a plan made on it must not look made for the preset), once.
    assert cluster.name == apply_calibration(cluster, cal).name == "2xcpu-calibrated"
    # A link measured under another name, with a negative fitted latency applied as 0.
    gpus = apply_calibration(load_cluster("8xH100-nvswitch"), cal, link_map={"nvswitch": "cuda-peer"})
    assert {(ch.latency_s, ch.bandwidth_bytes_per_s) for ch in gpus.channels} == {(0.0, 2e11)}
    with pytest.raises(OptionError, match="match no channel"):
        apply_calibration(load_cluster("4xV100-nvlink"), cal)


def test_a_loaded_latency_replaces_the_fitted_one_on_the_backends_channels(tmp_path):
    cal = replace(_calibration(), loaded_latency_s=4e-4)
    cal.save(tmp_path / "cal.json")
    assert load_calibration(tmp_path / "cal.json").loaded_latency_s == 4e-4
    assert load_calibration(tmp_path / "cal.json").meta == {"backend": "gloo"}  # not taken for meta
    # The gloo channels wait for a message as the ranks computing saw it, not as an idle ping-pong did...
    cluster = apply_calibration(load_cluster("2xcpu"), cal)
    assert {(ch.latency_s, ch.bandwidth_bytes_per_s) for ch in cluster.channels} == {(4e-4, 4e9)}
    assert cluster.transfer_s(0, 1, 4e9) == pytest.approx(1.0 + 4e-4)
    # ...and a link of another backend keeps its fit.
    gpus = apply_calibration(load_cluster("8xH100-nvswitch"), cal, link_map={"nvswitch": "cuda-peer"})
    assert {ch.latency_s for ch in gpus.channels} == {0.0}
    with pytest.raises(FormatError, match="loaded_latency_s"):
        Calibration.from_dict({**cal.to_dict(), "loaded_latency_s": -1.0}, "cal.json")


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"format": "placer.profile/1", "links": {}}, "field 'format'"),
        ({"format": "placer.calibration/1"}, "missing required field 'links'"),
        (
            {"format": "placer.calibration/1", "links": {"gloo": {"latency_s": 1e-5}}},
            "link 'gloo': missing required field 'bandwidth_bytes_per_s'",
        ),
        (
            {"format": "placer.calibration/1", "links": {"gloo": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 0}}},
            "'bandwidth_bytes_per_s' must be > 0",
        ),
        (
            {
                "format": "placer.calibration/1",
                "links": {"gloo": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e9, "samples": [[1, 2, 3]]}},
            },
            "sample #0",
        ),
        (
            {"format": "placer.calibration/1", "links": {}, "messages": {"send_fixed_s": 1e-5}},
            "field 'messages': missing required field 'send_per_byte_s'",
        ),
        ({"format": "placer.calibration/1", "links": {}, "barrier_s": -1e-4}, "field 'barrier_s'"),
        (
            {"format": "placer.calibration/1", "links": {}, "collectives": {"all_reduce": {"latency_s": 1e-5}}},
            "collective 'all_reduce': missing required field 'bandwidth_bytes_per_s'",
        ),
        (
            {
                "format": "placer.calibration/1",
                "links": {},
                "collectives": {"broadcast": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e9}},
            },
            "collective 'broadcast' is not one placer measures",
        ),
        (
            {
                "format": "placer.calibration/1",
                "links": {},
                "messages": {
                    "send_fixed_s": 1e-5,
                    "send_per_byte_s": 0,
                    "receive_fixed_s": 1e-5,
                    "receive_per_byte_s": 0,
                    "samples": [[0, 1, 1024, 1e-5]],
                },
            },
            "'messages': sample #0 must be",
        ),
    ],
)
def test_bad_calibration_files(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(__import__("json").dumps(doc))
    with pytest.raises(FormatError, match=message) as err:
        load_calibration(path)
    assert str(path) in str(err.value)


def test_real_gloo_calibration_two_ranks():
    # Sizes 32768x apart (the large one takes milliseconds) and the median of 9 round trips, so that
    # a loaded CI machine's noise cannot hide the bandwidth term (4 MiB and 5 round trips once could not).
    cal = calibrate("gloo", ranks=2, sizes=[1024, 32 << 20], repeats=9, timeout_s=120)
    fit = cal.links["gloo"]
    assert [b for b, _ in fit.samples] == [1024, 32 << 20]
    assert all(t > 0 for _, t in fit.samples)
    assert fit.bandwidth_bytes_per_s > 0 and np.isfinite(fit.r2)
    assert cal.meta["ranks"] == 2 and cal.meta["backend"] == "gloo"
    # The runtime's collectives on a bucket of each size, fitted.
    assert sorted(cal.collectives) == ["all_gather", "all_reduce"]
    for fit in cal.collectives.values():
        assert [b for b, _ in fit.samples] == [1024, 32 << 20] and all(t > 0 for _, t in fit.samples)
        assert fit.bandwidth_bytes_per_s > 0
    # A message's host cost, timed for the sizes up to MESSAGE_SIZE_LIMIT, on both sides.
    assert [(src, dst, b) for src, dst, b, _, _ in cal.message_samples] == [(0, 1, 1024)]
    assert all(sent > 0 and received > 0 for *_, sent, received in cal.message_samples)
    assert cal.message_cost.send_s(1024) > 0 and cal.message_cost.receive_s(1024) > 0
    # And in streams, a message every gap of MESSAGE_GAPS.
    assert [gap for gap, _, _ in cal.message_cost.by_gap] == list(MESSAGE_GAPS)
    assert all(sent >= 0 and received >= 0 for _, sent, received in cal.message_cost.by_gap)
    # And what an operation right after a message loses, each side (never below zero, finite).
    assert all(
        0 <= after < 0.1
        for after in (cal.message_cost.after_send_s, cal.message_cost.after_receive_s, cal.message_cost.after_wait_s)
    )
    # And the barrier that ends a step, for the last rank to reach it.
    assert 0 < cal.barrier_s < 1.0
    # And the latency of messages waited for while the ranks compute: every pair's both ways, of those whose
    # receiver was waiting before the send (most), positive, and what the calibrated channels take.
    assert 0 < cal.loaded_latency_s < 1.0
    assert 0.5 * 2 * LOADED_MESSAGES <= cal.meta["loaded_messages"] <= 2 * LOADED_MESSAGES
    assert {ch.latency_s for ch in apply_calibration(load_cluster("2xcpu"), cal).channels} == {cal.loaded_latency_s}


def test_loaded_latency_pairs_the_ranks_and_the_odd_one_computes():
    # Three ranks: 0 and 1 pair off, 2 computes until they are done (a hang here would time out).
    measured = measure_gloo(3, [1024, 4096], 1, timeout_s=120)
    assert 0.5 * 2 * LOADED_MESSAGES <= len(measured.loaded) <= 2 * LOADED_MESSAGES
    assert all(0 < t < 1.0 for t in measured.loaded)


def test_gloo_calibration_times_out_cleanly():
    with pytest.raises(PlacerError, match="did not finish within 0.2 s"):
        measure_gloo(2, [1024], 1, timeout_s=0.2)


def test_an_interrupted_gloo_calibration_leaves_no_rank_running(monkeypatch):
    import subprocess

    # Ctrl-C to placer alone (not its process group) left both ranks running for their whole timeout.
    started = []

    class Interrupted(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

        def communicate(self, *args, **kwargs):
            raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        measure_gloo(2, [1024], 1, timeout_s=60)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_terminated_calibration_stops_its_ranks_and_leaves_no_directory(tmp_path):
    import signal

    # SIGTERM to placer alone left both ranks running and the directory they write in behind.
    out = tmp_path / "cal.json"
    code, err, ranks = terminate_once_ranks_run(
        ["calibrate", "-o", str(out)], 2, b"_gloo_worker", env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert code == -signal.SIGTERM
    assert err.splitlines()[-1] == (
        "placer: terminated: the calibration's processes were stopped and nothing was written"
    )
    assert not outliving(ranks), "a rank outlived placer"
    assert not list(tmp_path.glob("placer-calibrate-*")), "the ranks' directory was left behind"
    assert not out.exists()


@pytest.mark.parametrize(
    "kwargs, message", [({"ranks": 1}, "ranks"), ({"repeats": 0}, "repeats"), ({"sizes": [0]}, "sizes")]
)
def test_gloo_calibration_options(kwargs, message):
    with pytest.raises(OptionError, match=message):
        measure_gloo(**{"ranks": 2, "sizes": [1024], "repeats": 1, **kwargs})


def test_probe_run_message_cost():
    # The streams' shape over gaps, scaled to what the probe's messages cost; the charges for the operation
    # after a message fitted to the probe's operations (not the streams'); the per-byte parts the probe's own.
    streams = MessageCost(
        3e-5,
        0.0,
        4e-5,
        0.0,
        by_gap=((0.0, 2e-5, 3e-5), (1e-3, 4e-5, 5e-5)),
        after_send_s=1e-6,
        after_receive_s=2e-6,
        after_wait_s=3e-6,
    )
    cost, fitted_to = measure_probe(streams, ("zoo:lenet", 8), steps=2)
    assert fitted_to > 0
    assert [gap for gap, _, _ in cost.by_gap] == [0.0, 1e-3]
    (_, send_0, receive_0), (_, send_1, receive_1) = cost.by_gap
    assert send_1 / send_0 == pytest.approx(2.0) and receive_1 / receive_0 == pytest.approx(5 / 3)
    assert cost.after_send_s >= 0 and cost.after_receive_s == cost.after_wait_s >= 0
    assert (cost.after_send_s, cost.after_receive_s) != (1e-6, 2e-6)
    assert send_0 > 0 and receive_0 > 0 and cost.send_per_byte_s >= 0 and cost.receive_per_byte_s >= 0


def test_probe_options(monkeypatch):
    from placer.harness import calibrate as calibrate_module

    monkeypatch.setattr(calibrate_module, "measure_cuda", lambda *a, **k: pytest.fail("measured before the check"))
    with pytest.raises(OptionError, match="'probe' runs gloo ranks"):
        calibrate("cuda", probe=True)
    with pytest.raises(OptionError, match="'steps' must be >= 2"):
        measure_probe(MessageCost(0.0, 0.0, 0.0, 0.0), steps=1)


def test_calibrate_cli_with_a_probe(tmp_path, capsys, monkeypatch):
    from placer.cli import cost as cost_cli
    from placer.cli import main
    from placer.harness import calibrate as calibrate_module

    probed = _calibration()
    probed.meta.update(
        probe={"model": "zoo:lenet", "batch": 8, "steps": 2, "messages": 40},
        stream_message_cost=probed.message_cost.to_dict(),
    )
    asked = {}
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: asked.update(k) or probed)
    monkeypatch.setattr(cost_cli, "calibrate", calibrate_module.calibrate)
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--probe", "-o", str(out)]) == 0
    assert asked["probe"] is True
    printed = capsys.readouterr().out
    assert (
        "fitted to 40 messages of a probe run (zoo:lenet, batch 8" in printed and "scaled to the probe run" in printed
    )
    saved = load_calibration(out)
    assert saved.meta["probe"]["messages"] == 40 and saved.message_cost == probed.message_cost
    assert MessageCost.from_dict(saved.meta["stream_message_cost"], "streams") == probed.message_cost


def test_calibrate_warns_of_a_fit_that_explains_little_of_its_points(tmp_path, capsys, monkeypatch):
    from placer.cli import cost as cost_cli
    from placer.cli import main
    from placer.harness import calibrate as calibrate_module

    # A 1 KiB message slower than a 64 KiB one (R^2 0.55) went silently into the cluster file.
    noisy = _calibration()
    noisy.links["gloo"] = LinkFit(1.24e-3, 2.8e9, 0.55, [(1024, 2e-3), (65536, 1e-3), (1 << 20, 1.6e-3)])
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: noisy)
    monkeypatch.setattr(cost_cli, "calibrate", calibrate_module.calibrate)
    assert main(["calibrate", "-o", str(tmp_path / "cal.json")]) == 0
    err = capsys.readouterr().err
    assert "the gloo fit explains little of its points (R^2 0.55" in err and "cuda-peer" not in err


def test_calibrate_refuses_a_cluster_it_could_not_apply_before_measuring(tmp_path, capsys, monkeypatch):
    from placer.cli import cost as cost_cli
    from placer.cli import main
    from placer.harness import calibrate as calibrate_module

    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: pytest.fail("measured before the check"))

    monkeypatch.setattr(cost_cli, "calibrate", calibrate_module.calibrate)
    out = ["-o", str(tmp_path / "cal.json"), "--cluster-output", str(tmp_path / "c.json")]
    assert main(["calibrate", "--backend", "gloo", "--cluster", "4xV100-nvlink", *out]) == 2
    assert "map one with --link LINK=gloo" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "gloo", "--cluster", "4xV100-nvlink", "-o", str(tmp_path / "c.json")]) == 2
    assert "needs '--cluster-output'" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "gloo", "--cluster", "2xcpu", "--link", "foo", *out]) == 2
    assert "give CHANNEL_LINK=MEASURED_LINK" in capsys.readouterr().err
    # Each refused before measuring (the cluster output was dropped without a word; the others failed after it).
    for argv, message in [
        (out, "'--cluster-output' needs '--cluster'"),
        (["--ranks", "1", *out[:2]], "'--ranks' must be >= 2"),
        (["--sizes", "1K,1024", *out[:2]], "'--sizes' needs two sizes or more"),
    ]:
        assert main(["calibrate", *argv]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "sizes, message",
    [
        ("1.5", "option '--sizes': '1.5' is 1.5 bytes, not a whole number of bytes"),  # was read as 1 byte
        ("4K,0.3K", "option '--sizes': '0.3K' is 307.2 bytes, not a whole number"),  # was 307
        ("-1K", "option '--sizes': sizes must be at least 4 bytes (one float32), got '-1K'"),
        ("0", "option '--sizes': sizes must be at least 4 bytes"),
        ("inf", "option '--sizes' expects sizes in bytes like 4096, 64K, 1.5M or 1G (K = 1024), got 'inf'"),  # a crash
        ("4K,,8K", "option '--sizes' expects sizes in bytes like 4096, 64K, 1.5M or 1G (K = 1024), got ''"),
        ("12 parsecs", "got '12 parsecs'"),
    ],
)
def test_calibrate_sizes_are_read_exactly_or_refused_before_measuring(tmp_path, capsys, monkeypatch, sizes, message):
    from placer.cli import cost as cost_cli
    from placer.cli import main
    from placer.harness import calibrate as calibrate_module

    measured = []

    def fake_calibrate(backend, *, sizes, **options):
        measured.append(sizes)
        raise OptionError("stop before measuring")

    monkeypatch.setattr(calibrate_module, "calibrate", fake_calibrate)

    monkeypatch.setattr(cost_cli, "calibrate", calibrate_module.calibrate)
    out = ["-o", str(tmp_path / "cal.json")]
    assert main(["calibrate", "--sizes", "1.5K,64K, 2MiB,.25K,1e3,4096B", *out]) == 2
    assert measured == [[1536, 65536, 2 << 20, 256, 1000, 4096]]
    assert main(["calibrate", f"--sizes={sizes}", *out]) == 2
    assert message in capsys.readouterr().err
    assert len(measured) == 1


# ------------------------------------------------------------------ profiles
import json  # noqa: E402

from placer.cost.profile import Profile, apply_profile, load_profile  # noqa: E402
from placer.generate import training_graph  # noqa: E402
from placer.harness.profiling import profile_module  # noqa: E402


def _profile_for(graph: OpGraph) -> Profile:
    return Profile(
        graph.name,
        graph.digest(),
        "cpu",
        {node: 1e-4 * (k + 1) for k, node in enumerate(graph.ids)},
        {"device_name": "test cpu", "torch": "2.13.0"},
    )


def test_profile_round_trip_and_apply(tmp_path):
    graph = training_graph(layers=2)
    path = tmp_path / "p.json"
    _profile_for(graph).save(path)
    loaded = load_profile(path, graph)
    assert loaded.node_seconds == _profile_for(graph).node_seconds
    assert loaded.meta == {"device_name": "test cpu", "torch": "2.13.0"}
    applied = apply_profile(graph, loaded)
    durations = applied.durations(load_cluster("2xcpu"))
    np.testing.assert_allclose(durations[:, 0], [1e-4 * (k + 1) for k in range(graph.num_nodes)])
    np.testing.assert_array_equal(applied.compute_s, graph.compute_s)  # the reference kind is untouched
    # Under another kind name, and keeping entries already there.
    both = apply_profile(annotate(graph, kinds=("A100",)), loaded, kind="H100")
    assert set(both.compute_s_by_kind[0]) == {"A100", "H100"}
    # The same operations under another name (another batch: the digest does not see sizes) are refused.
    with pytest.raises(FormatError, match="made for graph .* not for graph 'other-bs512'"):
        apply_profile(graph.replace(name="other-bs512"), loaded)


def _write(tmp_path, doc) -> str:
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: "{not json", "invalid JSON"),
        (lambda d: "", "empty"),
        (lambda d: {**d, "format": "placer.graph/1"}, "field 'format' is 'placer.graph/1'"),
        (lambda d: {k: v for k, v in d.items() if k != "format"}, "missing field 'format'"),
        (lambda d: {k: v for k, v in d.items() if k != "node_seconds"}, "missing required field 'node_seconds'"),
        (lambda d: {k: v for k, v in d.items() if k != "device_kind"}, "missing required field 'device_kind'"),
        (lambda d: {**d, "node_seconds": [1, 2]}, "field 'node_seconds' must be an object"),
        (lambda d: {**d, "node_seconds": {**d["node_seconds"], "loss": -1.0}}, "node 'loss': time must be >= 0"),
        (lambda d: {**d, "node_seconds": {**d["node_seconds"], "loss": "fast"}}, "node 'loss': time must be a number"),
        (lambda d: json.dumps(d).replace('"loss": 0.', '"loss": NaN, "x": 0.'), "NaN is not a valid number"),
        (lambda d: json.dumps(d).replace('"loss": 0.', '"loss": 1e999, "x": 0.'), "node 'loss': time must be finite"),
        (lambda d: {**d, "node_seconds": {**d["node_seconds"], "ghost": 1.0}}, "node 'ghost' is not in graph"),
        (lambda d: {**d, "graph_digest": "0123456789abcdef"}, "made for graph"),
    ],
)
def test_bad_profiles_name_file_and_field(tmp_path, mutate, message):
    graph = training_graph(layers=2)
    path = _write(tmp_path, mutate(_profile_for(graph).to_dict()))
    with pytest.raises(FormatError, match=message) as err:
        load_profile(path, graph)
    assert path in str(err.value)


def test_profile_of_another_graph_is_refused_by_apply():
    graph, other = training_graph(layers=2), training_graph(layers=3)
    with pytest.raises(FormatError, match="made for graph"):
        apply_profile(other, _profile_for(graph))


def test_profile_module_times_every_node():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(w, x):
        y = torch.relu(x @ w)
        return (y.sum(), torch.zeros(3, device="cpu"))

    gm = make_fx(step)(torch.randn(8, 8), torch.randn(4, 8))
    calls = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    seconds = profile_module(gm, [torch.randn(8, 8), torch.randn(4, 8)], repeats=3)
    assert set(seconds) == calls and all(t > 0 for t in seconds.values())
    only = profile_module(gm, [torch.randn(8, 8), torch.randn(4, 8)], repeats=1, warmup=0, node_ids={"mm"})
    assert set(only) == {"mm"}
    with pytest.raises(OptionError, match="repeats"):
        profile_module(gm, [], repeats=0)
    with pytest.raises(OptionError, match="device"):
        profile_module(gm, [], device="tpu")
    with pytest.raises(OptionError, match="gpu_timing"):
        profile_module(gm, [], gpu_timing="events")


# -------------------------------------------------------- standard evaluation
from placer.harness.standard_eval import fit_batch_model, match_nodes  # noqa: E402


def _step_at(batch: int, prefix: str = "") -> OpGraph:
    # Memory, FLOPs and edges exactly linear in the batch; a parameter node constant.
    ids = [f"{prefix}{n}" for n in ("w", "fwd", "loss", "upd")]
    return OpGraph(
        ids,
        [1e-5, 2e-5 * batch, 1e-6 * batch + 3e-6, 4e-5],
        [0, 1, 1, 2],
        [1, 2, 3, 3],
        [4096, 512 * batch, 128 * batch, 8],
        output_bytes=[4096, 512 * batch, 8, 4096],
        param_bytes=[4096, 0, 0, 8192],
        temp_bytes=[0, 64 * batch + 32, 0, 0],
        flops=[np.nan, 1e6 * batch, 2e3 * batch, 3e3],
        op=["aten.clone", "aten.mm", "aten.sum", "aten.add"],
        node_extra=[{}, {"bytes_accessed": 1000 * batch + 10}, {}, {}],
        splittable=[None, [{"dim": "batch", "size": batch}], [{"dim": "batch", "size": 16 * batch}], None],
        name=f"step-bs{batch}",
    )  # the loss's rows: 16 per sample (batch x sequence)


def test_standard_evaluation_predicts_linear_costs_exactly():
    model = fit_batch_model([_step_at(b) for b in (4, 1, 2)], [4, 1, 2])
    assert model.batches == [1, 2, 4] and model.matched_by == "id"
    big, truth = model.predict(256), _step_at(256)
    for name in ("output_bytes", "param_bytes", "temp_bytes", "edge_bytes"):
        np.testing.assert_array_equal(getattr(big, name), getattr(truth, name))
    np.testing.assert_allclose(big.compute_s, truth.compute_s, rtol=1e-9)
    np.testing.assert_allclose(big.flops, truth.flops, rtol=1e-9)
    assert big.node_extra[1]["bytes_accessed"] == 256010 and big.node_extra[0] == {}
    assert big.splittable == truth.splittable
    assert big.extra["standard_evaluation"]["matched_by"] == "id"
    assert max(model.fit_error.values()) < 1e-9
    with pytest.raises(OptionError, match="batch"):
        model.predict(0)


def test_standard_evaluation_scales_the_times_of_every_kind():
    def at(batch):
        g = _step_at(batch)
        return g.replace(compute_s_by_kind=[{"cpu": 10 * c} for c in g.compute_s.tolist()])

    big = fit_batch_model([at(b) for b in (1, 2, 4)], [1, 2, 4]).predict(256)
    assert [d["cpu"] for d in big.compute_s_by_kind] == pytest.approx((10 * _step_at(256).compute_s).tolist())


def test_standard_evaluation_with_profiles_fills_the_measured_kind():
    graphs = [_step_at(b) for b in (1, 2)]
    profiles = [Profile(g.name, g.digest(), "cpu", {"fwd": 1e-3 * b, "loss": 2e-4}) for g, b in zip(graphs, (1, 2))]
    big = fit_batch_model(graphs, [1, 2], profiles).predict(10)
    assert big.compute_s_by_kind[1]["cpu"] == pytest.approx(1e-2)
    assert big.compute_s_by_kind[2]["cpu"] == pytest.approx(2e-4)
    assert big.compute_s_by_kind[0]["cpu"] == pytest.approx(1e-5)  # unprofiled: the graph's own time
    # The reference kind's times have a line of their own (the graph's: fwd 2e-5 x batch, loss 1e-6 x batch +
    # 3e-6); they scaled with the measured kind's, which missed the loss's growth (the profile's is flat).
    assert big.compute_s[1:3] == pytest.approx([2e-4, 1.3e-5])


def test_a_prediction_of_captures_is_costed_by_the_roofline_again_on_every_kind_but_the_measured():
    # A line through batches 2 and 4 of an operation that turns compute-bound missed it at 64; the other
    # kinds scaled with the measured kind's growth (a V100 node by the CPU's).
    from placer.capture import capture_spec
    from placer.cost.analytic import annotate
    from placer.harness.standard_eval import standard_evaluation

    model = standard_evaluation("zoo:lenet", (2, 4), optimizer="sgd", device=None)
    predicted, truth = model.predict(64), capture_spec("zoo:lenet", 64, optimizer="sgd").graph
    np.testing.assert_allclose(predicted.compute_s, truth.compute_s, rtol=1e-9)
    assert predicted.extra["batch_size"] == truth.extra["batch_size"] == 64
    for got, want in zip(predicted.compute_s_by_kind, truth.compute_s_by_kind):
        assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-9) for k in want)
    graphs = [capture_spec("zoo:lenet", b, optimizer="sgd").graph for b in (2, 4)]
    profiles = [Profile(g.name, g.digest(), "cpu", {i: 1e-4 * b for i in g.ids}) for g, b in zip(graphs, (2, 4))]
    measured = fit_batch_model(graphs, [2, 4], profiles, analytic=True).predict(64)

    def work(g, node_id):
        i = g.index[node_id]
        return (
            float(np.nan_to_num(g.flops[i])),
            g.node_extra[i].get("bytes_accessed"),
            g.output_bytes[i],
            g.temp_bytes[i],
        )

    # A node with the same work at every batch (Adam's updates) keeps its median time: the line through
    # its times, noise alone, multiplied it 80-fold from batches 2, 4 and 8 to 512.
    same = [work(graphs[0], node_id) == work(graphs[1], node_id) for node_id in measured.ids]
    assert 0 < sum(same) < len(same)
    assert [d["cpu"] for d in measured.compute_s_by_kind] == pytest.approx([3e-4 if s else 6.4e-3 for s in same])
    again = annotate(measured, kinds=["A100", "H100"])
    assert [d["A100"] for d in measured.compute_s_by_kind] == [d["A100"] for d in again.compute_s_by_kind]


def test_nodes_match_by_position_when_ids_differ():
    node_map, edge_map, how = match_nodes(_step_at(1), _step_at(2, prefix="x_"))
    assert how == "position" and node_map.tolist() == [0, 1, 2, 3] and edge_map.tolist() == [0, 1, 2, 3]
    model = fit_batch_model([_step_at(1), _step_at(2, prefix="x_")], [1, 2])
    assert model.matched_by == "position"
    np.testing.assert_array_equal(model.predict(8).output_bytes, _step_at(8).output_bytes)


def test_standard_evaluation_refuses_other_structures():
    other = training_graph(layers=1)
    with pytest.raises(FormatError, match="differ in structure"):
        fit_batch_model([_step_at(1), other], [1, 2])
    renamed = _step_at(2).replace(op=["aten.clone", "aten.bmm", "aten.sum", "aten.add"])
    with pytest.raises(FormatError, match="'fwd' is 'aten.bmm' in one and 'aten.mm'"):
        fit_batch_model([_step_at(1), renamed], [1, 2])
    with pytest.raises(OptionError, match="two distinct"):
        fit_batch_model([_step_at(1), _step_at(1)], [1, 1])


# ------------------------------------------------- on captured training steps
torch = pytest.importorskip("torch")

from placer.capture import capture  # noqa: E402
from placer.harness.profiling import profile_step  # noqa: E402
from placer.harness.standard_eval import standard_evaluation  # noqa: E402


class _TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.net(x), y)


def _tiny(batch: int):
    torch.manual_seed(0)
    return _TinyNet(), (torch.randn(batch, 16), torch.randint(0, 4, (batch,)))


def test_profile_step_times_every_graph_node_and_leaves_the_model_alone(tmp_path):
    model, inputs = _tiny(8)
    step = capture(model, inputs, optimizer="adam")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile = profile_step(step, model, inputs, repeats=2)
    assert set(profile.node_seconds) == set(step.graph.ids)
    assert all(t >= 0 for t in profile.node_seconds.values())
    placeholders = [i for i, op in zip(step.graph.ids, step.graph.op) if op == "placeholder"]
    assert placeholders and all(profile.node_seconds[i] == 0.0 for i in placeholders)
    assert profile.node_seconds["addmm"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert profile.device_kind == "cpu" and profile.meta["inputs"] == "model"
    profile.save(tmp_path / "p.json")
    graph = apply_profile(step.graph, load_profile(tmp_path / "p.json", step.graph))
    np.testing.assert_allclose(
        graph.durations(load_cluster("2xcpu"))[:, 1], [profile.node_seconds[i] for i in graph.ids]
    )
    synthetic = profile_step(step, repeats=1, warmup=0)
    assert set(synthetic.node_seconds) == set(step.graph.ids) and synthetic.meta["inputs"] == "synthetic"


def test_standard_evaluation_on_a_captured_model():
    model = standard_evaluation(_tiny, (2, 4, 8), optimizer="sgd", repeats=2)
    assert model.matched_by == "id" and model.time_kind == "cpu"
    predicted = model.predict(64)
    truth = capture(*_tiny(64), optimizer="sgd").graph
    assert predicted.ids == truth.ids
    # Memory, FLOPs and transfers are linear in the batch: predicted exactly.
    for name in ("output_bytes", "param_bytes", "temp_bytes", "edge_bytes"):
        np.testing.assert_array_equal(getattr(predicted, name), getattr(truth, name))
    np.testing.assert_allclose(predicted.flops, truth.flops, rtol=1e-9)
    assert all(d["cpu"] >= 0 for d in predicted.compute_s_by_kind)
    analytic = standard_evaluation(_tiny, (2, 4), optimizer="sgd", device=None)
    assert analytic.time_kind is None
    np.testing.assert_allclose(analytic.predict(64).compute_s, truth.compute_s, rtol=1e-6, atol=1e-12)


# ---------------------------------------------------------------------- CLI
from placer.cli import main  # noqa: E402


def test_cost_command_annotates_and_applies_profiles(tmp_path, capsys):
    graph = training_graph(layers=2)
    graph.save(tmp_path / "g.json")
    _profile_for(graph).save(tmp_path / "p.json")
    out = tmp_path / "costed.json"
    assert (
        main(
            ["cost", str(tmp_path / "g.json"), "--kinds", "A100", "--profile", str(tmp_path / "p.json"), "-o", str(out)]
        )
        == 0
    )
    costed = OpGraph.load(out)
    assert set(costed.compute_s_by_kind[0]) == {"A100", "cpu"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_profile_for(graph).to_dict(), "node_seconds": {"ghost": 1.0}}))
    assert main(["cost", str(tmp_path / "g.json"), "--profile", str(bad), "-o", str(tmp_path / "x.json")]) == 2
    assert "node 'ghost' is not in graph" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    assert main(["cost", str(tmp_path / "g.json"), "--kinds", "TPU", "-o", str(tmp_path / "x.json")]) == 2
    assert "unknown device kind 'TPU'" in capsys.readouterr().err


def test_cost_command_says_when_the_presets_v100s_lose_their_own_times(tmp_path, capsys):
    training_graph(layers=2).save(tmp_path / "g.json")
    for kinds, lost in (("A100", True), ("A100,V100", False)):
        assert (
            main(
                [
                    "cost",
                    str(tmp_path / "g.json"),
                    "--reference",
                    "cpu",
                    "--kinds",
                    kinds,
                    "-o",
                    str(tmp_path / "c.json"),
                ]
            )
            == 0
        )
        assert ("the presets' V100s (speed 1.0) run at the cpu times" in capsys.readouterr().err) == lost
    assert "V100" in OpGraph.load(tmp_path / "c.json").compute_s_by_kind[0]


def test_cost_command_refuses_to_replace_measured_times_unless_told(tmp_path, capsys):
    # It wrote the analytic model's times over those of 'placer profile --graph-output', silently.
    graph = training_graph(layers=2)
    profile = _profile_for(graph)
    profile.save(tmp_path / "p.json")
    measured = tmp_path / "measured.json"
    apply_profile(graph, profile).save(measured)
    out = tmp_path / "costed.json"
    assert main(["cost", str(measured), "-o", str(out)]) == 2
    assert (
        f"graph file {measured} has measured times that the analytic model would replace: "
        f"{graph.num_nodes} for kind 'cpu' (node {graph.ids[0]!r}: 0.0001 s -> " in capsys.readouterr().err
    )
    assert not out.exists()

    def cpu_times():
        return [d["cpu"] for d in OpGraph.load(out).compute_s_by_kind]

    # Kept when cpu is not costed, or measured again by a profile; replaced when asked, saying so.
    assert main(["cost", str(measured), "--kinds", "A100", "-o", str(out)]) == 0
    assert cpu_times() == [profile.node_seconds[i] for i in graph.ids]
    assert main(["cost", str(measured), "--profile", str(tmp_path / "p.json"), "-o", str(out)]) == 0
    assert cpu_times() == [profile.node_seconds[i] for i in graph.ids]
    capsys.readouterr()
    assert main(["cost", str(measured), "--overwrite-measured", "-o", str(out)]) == 0
    assert (
        f"replaced {graph.num_nodes} measured times for kind 'cpu' by the analytic model's" in capsys.readouterr().out
    )
    assert cpu_times() == [d["cpu"] for d in annotate(graph).compute_s_by_kind]
    # The analytic model's own times (a captured graph's) are costed again without a word.
    annotate(graph).save(tmp_path / "analytic.json")
    assert main(["cost", str(tmp_path / "analytic.json"), "--reference", "A100", "-o", str(out)]) == 0
    assert "replaced" not in capsys.readouterr().out


_MODEL_FILE = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 3)
    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.layer(x), y)
def make(batch_size):
    torch.manual_seed(0)
    return Net(), (torch.randn(batch_size, 8), torch.randint(0, 3, (batch_size,)))
"""


@pytest.mark.parametrize(
    "option, message",
    [
        (["--batches", "2,2"], "needs at least two distinct batch sizes"),
        (["--repeats", "0"], "'--repeats' must be >= 1"),
    ],
)
def test_predict_refuses_bad_options_before_capturing(tmp_path, capsys, monkeypatch, option, message):
    from placer.cli import main
    from placer.harness import standard_eval

    monkeypatch.setattr(standard_eval, "standard_evaluation", lambda *a, **k: pytest.fail("captured first"))
    assert main(["predict", "zoo:lenet", "--target", "8", *option, "-o", str(tmp_path / "p.json")]) == 2
    assert message in capsys.readouterr().err


def test_profile_and_predict_commands(tmp_path, capsys):
    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    spec = f"{model_file}:make"
    assert (
        main(
            [
                "profile",
                spec,
                "--batch",
                "4",
                "--repeats",
                "2",
                "-o",
                str(tmp_path / "p.json"),
                "--graph-output",
                str(tmp_path / "g.json"),
            ]
        )
        == 0
    )
    graph = OpGraph.load(tmp_path / "g.json")
    profile = load_profile(tmp_path / "p.json", graph)
    assert set(profile.node_seconds) == set(graph.ids) and profile.device_kind == "cpu"
    assert all(d["cpu"] == profile.node_seconds[i] for i, d in zip(graph.ids, graph.compute_s_by_kind))
    assert (
        main(
            [
                "predict",
                spec,
                "--batches",
                "2,4",
                "--target",
                "32",
                "--device",
                "none",
                "-o",
                str(tmp_path / "big.json"),
            ]
        )
        == 0
    )
    big = OpGraph.load(tmp_path / "big.json")
    assert big.extra["standard_evaluation"]["target_batch"] == 32
    # The step it prints is the written graph's (it printed the line through the small batches').
    assert f"predicted step {big.compute_s.sum() * 1e3:.3f} ms (compute_s, one device)" in capsys.readouterr().out
    assert (
        main(
            ["predict", spec, "--batches", "2,4", "--target", "32", "--device", "tpu:0", "-o", str(tmp_path / "x.json")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "option 'device' must be 'cpu' or 'cuda:N', got 'tpu:0'" in err and "capturing" not in err
    assert main(["profile", spec, "--batch", "0", "-o", str(tmp_path / "x.json")]) == 2
    assert "'--batch' must be >= 1" in capsys.readouterr().err
    assert main(["profile", spec, "--batch", "2", "--device", "cuda:7", "-o", str(tmp_path / "x.json")]) == 2
    assert "device" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_fixed_part_is_fitted_read_back_and_applied(tmp_path):
    from placer.cost.profile import Profile, fixed_part

    big = Profile("g-bs32", "d", "cpu", {"conv": 10e-3, "add": 1e-3, "mm": 8e-3})
    small = Profile("g-bs8", "d", "cpu", {"conv": 4e-3, "add": 1.2e-3, "mm": 1e-3})
    fitted = fixed_part(big, small, 32, 8)
    # conv: 0.25 ms a sample and 2 ms fixed; add: slower on fewer rows, so all fixed; mm: steeper than
    # proportional (noise), so nothing fixed.
    assert fitted.fixed_seconds == pytest.approx({"conv": 2e-3, "add": 1e-3, "mm": 0.0})
    assert fitted.node_seconds == big.node_seconds and fitted.meta["fixed_part"] == {"small_batch": 8, "batch": 32}
    path = tmp_path / "p.json"
    fitted.save(path)
    assert Profile.from_dict(json.loads(path.read_text())).fixed_seconds == fitted.fixed_seconds
    with pytest.raises(OptionError, match="needs batch > small batch >= 1, got 8 and 8"):
        fixed_part(big, small, 8, 8)
    with pytest.raises(FormatError, match="does not time node 'mm'"):
        fixed_part(big, Profile("g-bs8", "d", "cpu", {"conv": 4e-3, "add": 1e-3}), 32, 8)
    doc = fitted.to_dict()
    doc["node_fixed_seconds"]["conv"] = 0.5
    with pytest.raises(FormatError, match="node 'conv': fixed time 0.5 is more than its time 0.01"):
        Profile.from_dict(doc, "p.json")
    doc["node_fixed_seconds"] = {"relu": 0.0}
    with pytest.raises(FormatError, match="node 'relu' has no time in node_seconds"):
        Profile.from_dict(doc, "p.json")

    graph = training_graph(layers=1)
    timed = Profile(graph.name, graph.digest(), "cpu", dict.fromkeys(graph.ids, 4e-3))
    timed.fixed_seconds = dict.fromkeys(graph.ids, 1e-3)
    applied = apply_profile(graph, timed)
    assert all(extra["fixed_s"] == {"cpu": 1e-3} for extra in applied.node_extra)
    # A profile without fixed parts times the nodes anew: their old fixed parts of its kind go.
    again = apply_profile(applied, Profile(graph.name, graph.digest(), "cpu", dict.fromkeys(graph.ids, 3e-3)))
    assert all("fixed_s" not in extra for extra in again.node_extra)


def test_profile_small_batch_records_each_operations_fixed_part(tmp_path, capsys):
    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    spec = f"{model_file}:make"
    out = ["-o", str(tmp_path / "p.json"), "--graph-output", str(tmp_path / "g.json")]
    assert main(["profile", spec, "--batch", "8", "--small-batch", "2", "--repeats", "2", *out]) == 0
    assert "of the operations' time at batch 8 is fixed (what batch 2 does not shrink)" in capsys.readouterr().out
    graph = OpGraph.load(tmp_path / "g.json")
    profile = load_profile(tmp_path / "p.json", graph)
    assert set(profile.fixed_seconds) == set(profile.node_seconds) == set(graph.ids)
    assert all(0 <= profile.fixed_seconds[n] <= profile.node_seconds[n] for n in graph.ids)
    assert all(extra["fixed_s"]["cpu"] == profile.fixed_seconds[n] for n, extra in zip(graph.ids, graph.node_extra))
    assert main(["profile", spec, "--batch", "8", "--small-batch", "8", "-o", str(tmp_path / "x.json")]) == 2
    assert "'--small-batch' must be >= 1 and below --batch (8), got 8" in capsys.readouterr().err


def test_contention_times_the_step_alone_and_in_processes_at_once(tmp_path):
    from placer.harness.contention import Contention, measure_contention

    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    measured = measure_contention(f"{model_file}:make", 4, 2, optimizer="sgd", seconds=0.2, rounds=3)
    assert isinstance(measured, Contention) and measured.processes == 2
    assert measured.alone_s > 0 and measured.together_s > 0
    # Three rounds, alone then together; the slowdown is their median ratio, and two single-thread processes
    # take at least 2 / cores as long: on one core they take turns.
    assert len(measured.ratios) == 3 and all(r > 0 for r in measured.ratios)
    assert measured.cores == os.cpu_count()
    assert measured.slowdown == max(sorted(measured.ratios)[1], 2 / measured.cores)
    assert measured.to_dict()["ratios"] == list(measured.ratios)
    # One process is its own reference.
    assert measure_contention(f"{model_file}:make", 4, 1, seconds=0.1).slowdown == 1.0
    with pytest.raises(OptionError, match="processes must be an integer >= 1, got 0"):
        measure_contention(f"{model_file}:make", 4, 0)
    with pytest.raises(OptionError, match="rounds must be an integer >= 1, got 0"):
        measure_contention(f"{model_file}:make", 4, 2, rounds=0)
    # A process that cannot build the model: its error, in one line.
    with pytest.raises(PlacerError, match="a training process failed: .*no_such_factory"):
        measure_contention(f"{model_file}:no_such_factory", 4, 2, seconds=0.1)


def test_profile_ranks_scales_every_operation_by_the_measured_contention(tmp_path, capsys, monkeypatch):
    import placer.cli.cost as cost_cli
    import placer.harness.profiling as profiling
    from placer.harness.contention import Contention

    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    spec = f"{model_file}:make"
    alone = {}

    def profiled(step, *args, **kwargs):
        seconds = dict.fromkeys(step.graph.ids, 1e-4)
        alone["profile"] = Profile(step.graph.name, step.graph.digest(), "cpu", seconds, {"device_name": "a CPU"})
        return alone["profile"]

    monkeypatch.setattr(profiling, "profile_step", profiled)
    asked = []
    monkeypatch.setattr(
        cost_cli, "measure_contention", lambda *args, **kwargs: asked.append(args) or Contention(args[2], 0.01, 0.025)
    )
    assert main(["profile", spec, "--batch", "4", "--ranks", "4", "-o", str(tmp_path / "p.json")]) == 0
    assert asked == [(spec, 4, 4)]
    profile = load_profile(tmp_path / "p.json")
    assert profile.node_seconds == pytest.approx({node: 2.5e-4 for node in alone["profile"].node_seconds})
    assert profile.meta["contention"] == {
        "processes": 4,
        "alone_s": 0.01,
        "together_s": 0.025,
        "cores": 0,
        "ratios": [],
        "slowdown": 2.5,
    }
    assert "4 processes at once take 2.50x as long for a step as one alone" in capsys.readouterr().out
    assert main(["profile", spec, "--batch", "4", "--ranks", "0", "-o", str(tmp_path / "x.json")]) == 2
    assert "'--ranks' must be >= 1" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_profile_and_predict_take_the_optimizers_capture_takes(tmp_path, capsys):
    # profile and predict took any --optimizer text (SGD, which capture refuses; a typo only failed
    # after loading the model): all three now add the option through one helper.
    import argparse
    import subprocess
    import sys

    from placer.capture import OPTIMIZERS
    from placer.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command in ("capture", "profile", "predict"):
        option = next(a for a in commands[command]._actions if "--optimizer" in a.option_strings)
        assert (set(option.choices or ()), option.default) == (set(OPTIMIZERS), "adam"), command
        with pytest.raises(SystemExit) as exited:
            main(
                [
                    command,
                    "zoo:lenet",
                    "--batch",
                    "2",
                    "--target",
                    "4",
                    "--optimizer",
                    "SGD",
                    "-o",
                    str(tmp_path / "x.json"),
                ]
            )
        assert exited.value.code == 2
        assert "argument --optimizer: invalid choice: 'SGD'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    # Offering the choices does not load torch.
    code = "import sys; from placer.capture.optim import OPTIMIZERS; assert 'torch' not in sys.modules, OPTIMIZERS"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_profile_and_predict_take_the_optimizer_settings_capture_takes(tmp_path, capsys):
    from placer.capture import load_model

    # Momentum adds a buffer per parameter and the nodes that update it: profile and predict captured the step
    # without it, so their graphs and profiles missed the nodes of `placer capture --momentum`'s graph.
    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    spec = f"{model_file}:make"
    settings = ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4"]
    assert main(["capture", spec, "--batch", "8", *settings, "-o", str(tmp_path / "c.json")]) == 0
    assert (
        main(
            [
                "profile",
                spec,
                "--batch",
                "8",
                *settings,
                "--repeats",
                "1",
                "-o",
                str(tmp_path / "p.json"),
                "--graph-output",
                str(tmp_path / "g.json"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "predict",
                spec,
                "--batches",
                "2,4",
                "--target",
                "8",
                *settings,
                "--device",
                "none",
                "-o",
                str(tmp_path / "big.json"),
            ]
        )
        == 0
    )
    captured = OpGraph.load(tmp_path / "c.json")
    plain = capture(*load_model(spec, 8), optimizer="sgd").graph
    assert len(captured.ids) > len(plain.ids)  # the momentum buffers' nodes
    for name in ("g.json", "big.json"):
        graph = OpGraph.load(tmp_path / name)
        assert graph.ids == captured.ids, name
    assert set(load_profile(tmp_path / "p.json", captured).node_seconds) == set(captured.ids)
    capsys.readouterr()
    for command in (["profile", spec, "--batch", "8"], ["predict", spec, "--target", "8"]):
        assert main([*command, "--momentum", "0.9", "-o", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert "--momentum is for --optimizer sgd, not adam" in err and "capturing" not in err
    assert not (tmp_path / "x.json").exists()


def test_predict_names_its_graph_as_capture_names_that_step(tmp_path):
    # predict named its graph after the model's class and the largest fitted batch ("Net-bs4-sgd@batch16"):
    # a profile of the step at that batch was refused for it, and the runtime read batch 4 from "-bs4-".
    model_file = tmp_path / "net.py"
    model_file.write_text(_MODEL_FILE)
    spec = f"{model_file}:make"
    assert main(["capture", spec, "--batch", "16", "--optimizer", "sgd", "-o", str(tmp_path / "c.json")]) == 0
    assert (
        main(
            [
                "predict",
                spec,
                "--batches",
                "2,4",
                "--target",
                "16",
                "--optimizer",
                "sgd",
                "--device",
                "none",
                "-o",
                str(tmp_path / "p.json"),
            ]
        )
        == 0
    )
    captured, predicted = OpGraph.load(tmp_path / "c.json"), OpGraph.load(tmp_path / "p.json")
    assert predicted.name == captured.name == "make-bs16-sgd" and predicted.ids == captured.ids
    profile = _profile_for(captured)
    assert apply_profile(predicted, profile).compute_s_by_kind[0]["cpu"] == profile.node_seconds[captured.ids[0]]
    # In Python: a factory is named as a file's FACTORY is, a lambda as capture names the model.
    fitted = standard_evaluation(_tiny, (2, 4), optimizer="SGD", device=None)
    assert (fitted.base.name, fitted.predict(8).name) == ("_tiny-bs4-sgd", "_tiny-bs8-sgd")
    fitted = standard_evaluation(lambda batch: _tiny(batch), (2, 4), optimizer="sgd", device=None)
    assert fitted.predict(8).name == capture(*_tiny(8), optimizer="sgd").graph.name == "_TinyNet-bs8-sgd"


def test_a_gpu_index_beyond_the_machines_gpus_is_an_option_error(monkeypatch):
    # On a one-GPU machine, torch itself would fail with a bare AssertionError inside get_device_name.
    from placer.cost.profile import device_kind_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(OptionError, match="'cuda:7' but this machine has 1 GPU"):
        device_kind_of("cuda:7")


def test_python_number_arithmetic_costs_a_gpu_nothing_and_a_cpu_its_per_op_overhead():
    # Adam's bias corrections are arithmetic on its step count as a Python number: the host runs
    # them while a GPU goes on with the kernels already queued; on a CPU the host is the device.
    # So is the step count itself: torch.optim.Adam keeps state["step"] on the CPU; and the learning rate's
    # .item(), a Python number in torch.optim.
    from collections import Counter

    from placer.capture import capture_spec
    from placer.cost.analytic import step_counter_nodes

    graph = capture_spec("zoo:lenet", 4, optimizer="adam", fake=True).graph
    host = np.array([op.startswith("_operator.") and op != "_operator.getitem" for op in graph.op])
    assert host.sum() == 7 * 10  # 3 pow, 2 sub, truediv, neg per parameter tensor; LeNet-5 has 10
    counter = step_counter_nodes(graph)
    # step += 1, its write-back, .item() of the step; the one .item() of the learning rate
    assert Counter(graph.op[i] for i in np.flatnonzero(counter & ~host)) == {
        "aten.add": 10,
        "aten.copy_": 10,
        "aten._local_scalar_dense": 10 + 1,
    }
    host |= counter
    for reference in ("V100", "cpu"):
        g = annotate(graph, reference=reference, kinds=("A100", "H100"))
        expected = DEVICE_SPECS[reference].host_op_s
        assert np.all(g.compute_s[host] == expected)
        assert all(g.compute_s_by_kind[i][k] == 0.0 for i in np.flatnonzero(host) for k in ("A100", "H100"))
        assert np.all(g.compute_s[~host & (g.flops > 0)] >= DEVICE_SPECS[reference].launch_overhead_s)
    assert DEVICE_SPECS["cpu"].host_op_s == 5e-6


def test_a_profile_for_a_kind_the_cluster_lacks_is_refused_and_simulate_says_a_plan_was_costed_otherwise(
    tmp_path, capsys
):
    # A cpu profile on 4 V100s was silently ignored; simulating a plan made with a profile, without it,
    # gave another step than the plan's own with no word.
    graph = training_graph(layers=2)
    graph.save(tmp_path / "g.json")
    _profile_for(graph).save(tmp_path / "p.json")
    plan = tmp_path / "plan.json"
    base = [
        "plan",
        str(tmp_path / "g.json"),
        "--profile",
        str(tmp_path / "p.json"),
        "--algorithm",
        "expert",
        "-o",
        str(plan),
    ]
    assert main(base + ["--cluster", "4xV100-nvlink"]) == 2
    assert (
        "p.json: a profile of device kind 'cpu', which cluster '4xV100-nvlink' does not have (its kinds: V100)"
        in capsys.readouterr().err
        and not plan.exists()
    )
    assert main(base + ["--cluster", "2xcpu"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "g.json"), str(plan), "--profile", str(tmp_path / "p.json")]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "g.json"), str(plan)]) == 0
    assert f"placer: note: plan {plan} predicted" in capsys.readouterr().err
    assert main(["validate", str(plan), "--graph", str(tmp_path / "g.json")]) == 0
    assert "it was planned with other costs" in capsys.readouterr().out


def test_validate_takes_the_profile_a_plan_was_made_with_and_checks_it_against_each_plan_s_cluster(tmp_path, capsys):
    from placer.cli import main

    graph = training_graph(layers=2)
    graph_file, profile, on_cpu, on_v100 = (
        str(tmp_path / name) for name in ("g.json", "p.json", "cpu.json", "v100.json")
    )
    graph.save(graph_file)
    _profile_for(graph).save(profile)
    assert main(["plan", graph_file, "--cluster", "2xcpu", "--profile", profile, "-o", on_cpu]) == 0
    assert main(["plan", graph_file, "--cluster", "2xV100-nvlink", "-o", on_v100]) == 0
    capsys.readouterr()
    assert main(["validate", on_cpu, "--graph", graph_file, "--profile", profile]) == 0
    made = json.loads(Path(on_cpu).read_text())["predicted"]["makespan_s"]
    assert capsys.readouterr().out == f"{on_cpu}: valid plan, makespan {made * 1e3:.3f} ms, fits memory\n"
    # A plan whose own cluster has no device of the profile's kind: refused, naming both files.
    assert main(["validate", on_v100, on_cpu, "--graph", graph_file, "--profile", profile]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(f"{on_cpu}: valid plan")
    assert err == (
        f"placer: error: {on_v100}: {profile}: a profile of device kind 'cpu', which cluster "
        f"'2xV100-nvlink' does not have (its kinds: V100): no time of it would be used\n"
    )
    assert main(["validate", on_cpu, "--profile", profile]) == 2
    assert capsys.readouterr().err == (
        "placer: error: option '--profile' re-costs the graph plans are checked against, which needs '--graph' too\n"
    )
