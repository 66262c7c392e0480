"""compare, its report files, and auto."""

import csv
import json
import re

import numpy as np
import pytest

from placer import load_cluster, place, simulate_plan
from placer.cli import main
from placer.cluster import Channel, Cluster, Device
from placer.generate import random_dag, training_graph
from placer.graph import OpGraph
from placer.report.compare import COLUMNS, Comparison, Entry, compare
from placer.report.tables import figure, simulation_text
from placer.sim import simulate
from placer.sim.critical import critical_path_nodes


@pytest.fixture(scope="module")
def comparison():
    return compare(training_graph(layers=4, branches=2, seed=2), load_cluster("2xV100-nvlink"), progress=False)


def test_report_figures_equal_the_simulator(comparison, tmp_path):
    paths = comparison.write(tmp_path)
    table = json.loads(paths["json"].read_text())
    by_name = {row["algorithm"]: row for row in table["rows"]}
    for entry in comparison.entries:
        fresh = simulate_plan(entry.plan, comparison.graph, comparison.cluster)
        assert by_name[entry.algorithm]["makespan_ms"] == pytest.approx(fresh.makespan_s * 1e3, rel=1e-9)
        assert table["peak_memory_bytes"][entry.algorithm] == {
            d.name: int(p) for d, p in zip(comparison.cluster.devices, fresh.peak_memory_bytes)
        }
        assert (tmp_path / f"gantt-{entry.algorithm}.png").read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / f"plan-{entry.algorithm}.json").exists()
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["algorithm"] for r in rows] == [e.algorithm for e in comparison.entries]
    html = paths["html"].read_text()
    assert "http://" not in html and "https://" not in html, "the report needs no network"
    assert html.count("data:image/png;base64,") == 2 * len(comparison.entries)
    best = comparison.best
    assert f"{best.makespan_s * 1e3:.3f}" in html
    assert "| expert |" in paths["markdown"].read_text()


def test_speedups_are_relative_to_expert_and_single(comparison):
    rows = {r["algorithm"]: r for r in comparison.rows()}
    assert rows["expert"]["speedup_over_expert"] == pytest.approx(1.0)
    assert rows["single"]["speedup_over_single"] == pytest.approx(1.0)
    ratio = comparison.entry("expert").makespan_s / comparison.entry("metis").makespan_s
    assert rows["metis"]["speedup_over_expert"] == pytest.approx(ratio)


def test_compare_command_writes_report(tmp_path, capsys):
    graph = tmp_path / "g.json"
    training_graph(layers=2, branches=2).save(graph)
    code = main(
        [
            "compare",
            str(graph),
            "--cluster",
            "2xV100-nvlink",
            "--algorithms",
            "single,expert",
            "-o",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    assert (tmp_path / "out" / "report.html").exists()
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"report: {tmp_path / 'out' / 'report.html'} (also ")
    # Without -o the table alone, and a line that says how to get the report.
    code = main(["compare", str(graph), "--cluster", "2xV100-nvlink", "--algorithms", "single,expert"])
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "report: none written (-o DIR writes report.html, comparison.md/.csv/.json, the plans and their charts)"
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_is_never_slower_than_any_member(seed):
    graph = training_graph(layers=5, branches=3, seed=seed)
    cluster = load_cluster("4xGPU-pcie")
    plan = place(graph, cluster, "auto", seed=seed, max_evaluations=60)
    for name in ("single", "round_robin", "expert", "metis"):
        assert plan.predicted["makespan_s"] <= place(graph, cluster, name, seed=seed).predicted["makespan_s"] * (
            1 + 1e-12
        )


def test_auto_fits_when_only_some_members_do():
    graph = training_graph(layers=6, branches=2, param_mib=1500, activation_mib=100, seed=5)
    cluster = load_cluster("4xV100-nvlink")
    plan = place(graph, cluster, "auto", max_evaluations=40)
    assert plan.predicted["fits"]
    assert plan.extra["auto"]["start"] != "single"


def test_critical_path_is_a_chain_ending_at_the_makespan():
    graph = random_dag(40, edge_prob=0.4, seed=3)
    cluster = load_cluster("4xV100-nvlink")
    result = simulate(graph, cluster, np.arange(40) % 4)
    chain = critical_path_nodes(result)
    assert result.finish[chain[-1]] == result.makespan_s
    assert np.all(np.diff(result.start[chain]) > -1e-15)
    # The chain starts at a node that started at time 0 or waited for nothing on the chain.
    assert result.start[chain[0]] == 0.0


def test_no_plan_beats_the_lower_bound_that_holds_for_it():
    # data_parallel and os_dpos split operations: their gap is to the work bound, never below it.
    graph = training_graph(layers=3, branches=2, seed=3)
    comparison = compare(
        graph, load_cluster("4xV100-nvlink"), ["expert", "dpos", "data_parallel", "os_dpos"], progress=False
    )
    rows = {row["algorithm"]: row for row in comparison.rows()}
    assert comparison.split_lower_bound_s <= comparison.lower_bound_s
    for name, row in rows.items():
        assert row["gap_to_lower_bound"] >= -1e-9, (name, row)
    splitting = [e for e in comparison.entries if e.plan is not None and e.plan.rewritten_graph is not None]
    assert splitting and all(comparison.bound_for(e) == comparison.split_lower_bound_s for e in splitting)


def test_names_with_dollar_signs_are_drawn_as_written(tmp_path):
    # matplotlib reads $...$ as math: a graph, cluster or device so named made the charts raise after the run.
    graph = training_graph(layers=2, branches=2, name="cost $x^$ model")
    cluster = Cluster(
        "box $\\frac$",
        [Device("gpu$0$", "V100", 16 << 30), Device("gpu$1", "V100", 16 << 30)],
        [
            Channel("gpu$0$->gpu$1", 25e9, 1e-5, (("gpu$0$", "gpu$1"),)),
            Channel("gpu$1->gpu$0$", 25e9, 1e-5, (("gpu$1", "gpu$0$"),)),
        ],
    )
    paths = compare(graph, cluster, ["single", "round_robin"], progress=False).write(tmp_path)
    assert (tmp_path / "gantt-round_robin.png").read_bytes()[:4] == b"\x89PNG"
    assert "cost $x^$ model" in paths["html"].read_text()


def test_interrupted_write_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    # The charts are the slow part: Ctrl-C (or an error) while they are drawn wrote some charts and no report.
    import placer.report.charts

    graph, cluster = training_graph(layers=2, branches=2), load_cluster("2xcpu")
    folder = tmp_path / "report"
    compare(graph, cluster, ["single"], progress=False).write(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(placer.report.charts, "memory_chart", interrupted)
    again = compare(graph, cluster, ["round_robin", "expert"], progress=False)
    for target in (folder, tmp_path / "fresh"):
        with pytest.raises(KeyboardInterrupt):
            again.write(target)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not any((tmp_path / "fresh").iterdir())


def test_gap_to_a_zero_lower_bound(tmp_path, capsys):
    # Operations that take no time: the bound is 0, and a plan whose transfers take time has no finite gap to
    # it (it read 0%, as if the plan were optimal); a plan that takes no time either is at the bound.
    graph = OpGraph(["a", "b", "c"], [0.0, 0.0, 0.0], [0, 1], [1, 2], [1 << 20, 1 << 20], name="free")
    comparison = compare(graph, load_cluster("2xcpu"), ["single", "round_robin"], progress=False)
    rows = {row["algorithm"]: row for row in comparison.rows()}
    assert comparison.lower_bound_s == 0 and rows["round_robin"]["makespan_ms"] > 0
    assert rows["round_robin"]["gap_to_lower_bound"] is None
    assert rows["single"]["gap_to_lower_bound"] == 0.0
    comparison.print()
    assert "round_robin" in capsys.readouterr().out
    paths = comparison.write(tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][1]["gap_to_lower_bound"] is None
    assert (
        f"<td>round_robin</td><td>{rows['round_robin']['makespan_ms']:.3f}</td><td>-</td>" in paths["html"].read_text()
    )


def test_small_peaks_keep_their_differences(tmp_path):
    # A small model's peaks are MiB: in GiB to two or three places they all read 0.00 (a LeNet's on every device).
    graph = training_graph(layers=2, branches=2, param_mib=0.05, activation_mib=0.02)
    comparison = compare(graph, load_cluster("2xcpu"), ["single", "round_robin"], progress=False)
    paths = comparison.write(tmp_path)
    per_device = paths["html"].read_text().split("Peak memory per device")[1]
    markdown = {line.split(" | ")[0][2:]: line.split(" | ") for line in paths["markdown"].read_text().splitlines()}
    for e in comparison.entries:
        peaks = e.result.peak_memory_bytes / 2**30
        assert 0 < peaks.max() < 0.005
        shown = re.findall(r"<td>([^<]*)</td>", re.search(rf"<tr><td>{e.algorithm}</td>(.*?)</tr>", per_device)[1])
        assert [float(x) for x in shown] == pytest.approx(peaks, rel=0.01)
        assert float(markdown[e.algorithm][COLUMNS.index("max_peak_memory_gib")]) == pytest.approx(
            peaks.max(), rel=0.01
        )
        text = simulation_text(e.result, {**e.result.predicted(), "lower_bound_s": comparison.lower_bound_s})
        assert [float(x) for x in re.findall(r"(\S+) / 8 GiB", text)] == pytest.approx(peaks, rel=0.01)


def test_a_note_of_several_lines_stays_in_its_markdown_row():
    # An internal error's message may span lines (a parser's, with a caret): it ended the row and the table.
    comparison = Comparison(
        training_graph(layers=2, branches=2),
        load_cluster("2xcpu"),
        [
            Entry("broken", error="broken: internal error (please report): ValueError: \nx^\n  ^"),
            Entry("other", error="other: no plan | none"),
        ],
    )
    rows = comparison.markdown().splitlines()[-2:]
    assert rows == [
        "| broken | - | - | - | - | - | no | - | broken: internal error (please report): ValueError: x^ ^ |",
        "| other | - | - | - | - | - | no | - | other: no plan / none |",
    ]


def test_figures_below_one_keep_their_trailing_zeros():
    assert [figure(v, 3) for v in (0.58, 0.5798, 1.5e-5, 0.0, 16.0, 2.5)] == [
        "0.580",
        "0.580",
        "1.50e-05",
        "0.000",
        "16.000",
        "2.500",
    ]


def test_a_report_written_again_keeps_no_plan_or_chart_of_the_earlier_one(tmp_path):
    from placer.cluster import load_cluster
    from placer.generate import training_graph
    from placer.report.compare import compare

    graph, cluster = training_graph(layers=2, branches=1, seed=1), load_cluster("2xcpu")
    compare(graph, cluster, ["single", "expert"], progress=False).write(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    compare(graph, cluster, ["single"], progress=False).write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "comparison.csv",
        "comparison.json",
        "comparison.md",
        "gantt-single.png",
        "memory-single.png",
        "notes.txt",
        "plan-single.json",
        "report.html",
    ]
