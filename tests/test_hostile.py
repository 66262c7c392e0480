"""Hostile and unlucky input (issue 60): files, signals and names that must not cost a user a file or a terminal.

One test or more per item, named by it: special files as outputs (1), outputs over inputs (2), rewritten graphs
of a plan (3), Ctrl-C (4), tracebacks (5), SIGTERM while a report is written (6), terminal escapes (8), HTML in
Markdown (9), long values in messages (10), one nesting limit (11), a factory's sys.exit() (12), and what held
before (weights-only loads, escaped report.html, plans of other graphs refused).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from placer.algorithms import place
from placer.cli import main
from placer.cluster import Channel, Cluster, Device, load_cluster
from placer.errors import FormatError
from placer.generate import training_graph
from placer.graph import OpGraph
from placer.io import MAX_FILE_BYTES, MAX_NESTING, WriteError, command_scope, read_bytes, write_json_atomic
from placer.plan import Plan
from placer.report.compare import compare

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv) -> tuple[int, str, str]:
    """``placer ARGV`` in this process: its status, stdout and stderr."""
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def placer_process(script: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``script`` (Python, with ``placer`` importable) in a fresh process whose signals are its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture
def graph_file(tmp_path) -> Path:
    path = tmp_path / "g3.json"
    training_graph(layers=3, branches=2, seed=1).save(path)
    return path


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too), by its path relative to it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- 1
def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return server


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_1_an_output_that_is_a_special_file_is_refused_not_replaced(tmp_path, capsys, graph_file, kind):
    target = tmp_path / "out"
    made = _fifo(target) if kind == "fifo" else _socket(target)
    try:
        status, _, err = run(capsys, "plan", graph_file, "--cluster", "2xcpu", "--algorithm", "m_etf", "-o", target)
        mode = os.stat(target).st_mode
    finally:
        if kind == "socket":
            made.close()
    assert status == 2 and len(err.splitlines()) == 1
    assert "not a regular file" in err and ("FIFO" in err if kind == "fifo" else "socket" in err)
    assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISSOCK)(mode)


@pytest.mark.parametrize("output", ["-", "/proc/self/fd/1"])
def test_1_standard_output_is_written_into_and_the_summary_goes_to_stderr(
    tmp_path, capsys, monkeypatch, graph_file, output
):
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "plan", graph_file, "--cluster", "2xcpu", "--algorithm", "m_etf", "-o", output)
    assert status == 0, err
    assert json.loads(out)["format"] == "placer.plan/1"  # the plan alone: the summary went to stderr
    assert "m_etf: makespan" in err
    assert not (tmp_path / "-").exists()


# ----------------------------------------------------------------------------- 2
def test_2_capture_refuses_to_write_over_the_model_source(tmp_path, capsys, monkeypatch):
    model = tmp_path / "model.py"
    source = "import torch\n\ndef make(batch):\n    return torch.nn.Linear(2, 1), (torch.zeros(batch, 2),)\n"
    model.write_text(source)
    monkeypatch.chdir(tmp_path)
    for output in ("model.py", "./model.py", str(model)):  # the same file, however spelled
        status, _, err = run(capsys, "capture", "model.py:make", "--batch", "2", "-o", output)
        assert status == 2 and "is the input file" in err, err
    assert model.read_text() == source


def test_2_run_refuses_a_trace_over_its_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run(capsys, "plan", "zoo:lenet", "--batch", "8", "--cluster", "2xcpu", "--algorithm", "single", "-o", "p.json")[
            0
        ]
        == 0
    )
    before = Path("p.json").read_bytes()
    os.link("p.json", "same.json")  # another name of the same file
    for trace in ("p.json", "./p.json", "same.json"):
        status, _, err = run(
            capsys,
            "run",
            "zoo:lenet",
            "--batch",
            "8",
            "--plan",
            "p.json",
            "--backend",
            "distributed",
            "--steps",
            "2",
            "--trace",
            trace,
        )
        assert status == 2 and "is the input file" in err, err
    assert Path("p.json").read_bytes() == before


def test_2_cost_refuses_an_output_that_is_its_graph_by_inode(tmp_path, capsys, graph_file):
    os.link(graph_file, tmp_path / "other-name.json")
    before = graph_file.read_bytes()
    status, _, err = run(capsys, "cost", graph_file, "-o", tmp_path / "other-name.json")
    assert status == 2 and "is the input file" in err
    assert graph_file.read_bytes() == before


def test_2_no_output_of_a_command_replaces_a_file_it_read(tmp_path, graph_file):
    # Whatever the command forgot to name as an input: within a command, every file read is one.
    with command_scope():
        OpGraph.load(graph_file)
        with pytest.raises(WriteError, match="is the input file"):
            write_json_atomic(graph_file, {"format": "placer.graph/1", "nodes": [], "edges": []}, "graph file")
    training_graph(layers=1).save(graph_file)  # a program outside any command may (read, change, save)


# ----------------------------------------------------------------------------- 3
def _dp_plan(graph: OpGraph, cluster_name: str = "2xV100-nvlink") -> Plan:
    return place(graph, load_cluster(cluster_name), "data_parallel")


def _save(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _makespan(line: str) -> float:
    return float(re.search(r"makespan ([0-9.]+) ms", line)[1])


def test_3_a_plan_carrying_an_unrelated_rewritten_graph_is_refused(tmp_path, capsys, graph_file):
    graph = OpGraph.load(graph_file)
    other = _dp_plan(training_graph(layers=2, branches=1, seed=7)).to_dict()
    mine = _dp_plan(graph).to_dict()
    forged = {**other, **{k: mine[k] for k in ("graph", "graph_digest", "cluster", "cluster_digest")}}
    path = _save(forged, tmp_path / "forged.json")
    for argv in (["validate", path, "--graph", graph_file], ["simulate", graph_file, path]):
        status, _, err = run(capsys, *argv)
        assert status == 2 and "rewritten graph" in err and "is not what" in err, err


def test_3_a_cost_cut_rewritten_graph_is_simulated_on_the_graphs_costs(tmp_path, capsys, graph_file):
    graph = OpGraph.load(graph_file)
    honest = _dp_plan(graph)
    doc = honest.to_dict()
    for node in doc["rewritten_graph"]["nodes"]:
        node["compute_s"] = 0.0
        node.pop("compute_s_by_kind", None)
    path = _save(doc, tmp_path / "cut.json")
    status, out, _ = run(capsys, "validate", path, "--graph", graph_file)
    assert status == 0
    assert _makespan(out) == pytest.approx(honest.predicted["makespan_s"] * 1e3, abs=1e-3)
    status, out, _ = run(capsys, "simulate", graph_file, path, "--json")
    report = json.loads(out)
    assert report["makespan_s"] >= report["lower_bound_s"] > 0


def test_3_a_rewritten_graph_missing_nodes_is_refused(tmp_path, capsys):
    graph = training_graph(layers=6, branches=2, seed=3)
    graph_path = tmp_path / "g.json"
    graph.save(graph_path)
    doc = _dp_plan(graph).to_dict()
    rewritten = doc["rewritten_graph"]
    gone = {node["id"] for node in rewritten["nodes"][-40:]}
    assert len(gone) == 40
    rewritten["nodes"] = [n for n in rewritten["nodes"] if n["id"] not in gone]
    rewritten["edges"] = [e for e in rewritten["edges"] if e["src"] not in gone and e["dst"] not in gone]
    doc["placement"] = {n: d for n, d in doc["placement"].items() if n not in gone}
    doc["order"] = {d: [n for n in seq if n not in gone] for d, seq in doc["order"].items()}
    path = _save(doc, tmp_path / "cut.json")
    for argv in (["validate", path, "--graph", graph_path], ["simulate", graph_path, path]):
        status, _, err = run(capsys, *argv)
        assert status == 2 and "is not what" in err, err


def test_3_plans_that_split_or_replicate_still_validate(tmp_path, capsys):
    from placer.capture import capture_spec

    lenet = capture_spec("zoo:lenet", 32).graph  # data parallelism, then a split (os_dpos on two devices)
    conv = OpGraph(
        ["x", "conv"],
        [0.0, 8.0],
        [0],
        [1],
        [800],
        op=["placeholder", "aten.convolution"],
        output_bytes=[800, 400],
        splittable=[None, [{"dim": "batch", "size": 8}]],
        name="conv",
    )
    cases = [
        (lenet, "data_parallel", "2xV100-nvlink", {}),
        (lenet, "sharded_data_parallel", "4xV100-nvlink", {}),
        (lenet, "os_dpos", "2xV100-nvlink", {"time_limit": 20}),
        (conv, "os_dpos", "2xV100-nvlink", {"data_parallel_start": False}),
    ]
    for graph, algorithm, cluster, options in cases:
        graph_path = tmp_path / f"{graph.name}.json"
        graph.save(graph_path)
        plan = place(graph, load_cluster(cluster), algorithm, **options)
        assert plan.rewritten_graph is not None or plan.splits
        path = tmp_path / f"{algorithm}.json"
        plan.save(path)
        status, out, err = run(capsys, "validate", path, "--graph", graph_path)
        assert status == 0, err
        assert _makespan(out) == pytest.approx(plan.predicted["makespan_s"] * 1e3, abs=1e-3)


# ----------------------------------------------------------------------------- 4
_SWALLOWED = """
    import os, signal, sys
    import placer.algorithms, placer.cli.core, placer.report.compare
    from placer.cli import main

    real = placer.algorithms.place

    def swallowing(*args, **kwargs):
        # What OR-Tools, or a search that keeps its best so far, does with Ctrl-C: catch it, and go on.
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    placer.algorithms.place = placer.cli.core.place = placer.report.compare.place = swallowing
    sys.exit(main({argv!r}))
"""


def test_4_ctrl_c_that_a_library_swallows_still_interrupts_plan_and_keeps_the_output(tmp_path, graph_file):
    output = tmp_path / "p.json"
    output.write_text("previous")
    done = placer_process(
        _SWALLOWED.format(
            argv=["plan", str(graph_file), "--cluster", "2xcpu", "--algorithm", "m_etf", "-o", str(output)]
        ),
        tmp_path,
    )
    assert done.returncode == 130 and done.stderr.splitlines() == ["placer: interrupted"], done.stderr
    assert output.read_text() == "previous"


def test_4_ctrl_c_that_a_library_swallows_still_interrupts_compare_and_keeps_the_report(tmp_path, graph_file):
    folder = tmp_path / "report"
    compare(OpGraph.load(graph_file), load_cluster("2xcpu"), ["single"], progress=False).write(folder)
    before = contents(folder)
    done = placer_process(
        _SWALLOWED.format(
            argv=["compare", str(graph_file), "--cluster", "2xcpu", "--algorithms", "m_etf,single", "-o", str(folder)]
        ),
        tmp_path,
    )
    assert done.returncode == 130 and done.stderr.splitlines()[-1:] == ["placer: interrupted"], done.stderr
    assert contents(folder) == before


def test_4_ctrl_c_during_auto_exits_130_and_keeps_the_previous_plan(tmp_path, graph_file):
    # auto stops at Ctrl-C and returns its best so far; the command must not save that as its result.
    (tmp_path / "p.json").write_text("previous")
    done = placer_process(
        f"""
        import signal, sys
        import placer.algorithms.auto as auto
        from placer.cli import main

        real, calls = auto.place, []

        def member(*args, **kwargs):        # Ctrl-C once auto has a plan in hand: while its second member runs
            calls.append(args[2])
            if len(calls) == 2:
                signal.raise_signal(signal.SIGINT)
            return real(*args, **kwargs)

        auto.place = member
        status = main(["plan", {str(graph_file)!r}, "--cluster", "4xV100-nvlink", "--algorithm", "auto",
                       "-o", "p.json"])
        assert len(calls) >= 2, calls
        sys.exit(status)
        """,
        tmp_path,
    )
    assert done.returncode == 130 and done.stderr.splitlines() == ["placer: interrupted"], done.stderr
    assert (tmp_path / "p.json").read_text() == "previous"


# ----------------------------------------------------------------------------- 5
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algorithm", "m_etf", "--time-limit", "1e10"], "must be at most 1,000,000 seconds"),
        (["--algorithm", "pesto", "--seed", "2147483648"], "must be at most 2147483647"),
        (["--algorithm", "metis", "--seed", "9223372036854775808"], "must be at most 2147483647"),
        (["--algorithm", "metis", "--option", "seed=4294967296"], "must be at most 2147483647"),
    ],
)
def test_5_out_of_range_limits_and_seeds_are_one_line_errors(tmp_path, capsys, graph_file, argv, message):
    status, _, err = run(capsys, "plan", graph_file, "--cluster", "2xcpu", "-o", tmp_path / "p.json", *argv)
    assert status == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "p.json").exists()


def test_5_compare_refuses_an_out_of_range_seed(capsys, graph_file):
    status, _, err = run(
        capsys, "compare", graph_file, "--cluster", "2xcpu", "--algorithms", "metis,pesto", "--seed", str(2**31)
    )
    assert status == 2 and "must be at most 2147483647" in err


@pytest.mark.parametrize(
    "target, message",
    [
        ("/dev/zero", "placer: error: file /dev/zero: is a character device, not a file"),
        ("huge.json", "placer: error: file huge.json: larger than the 512.0 MiB placer reads (MAX_FILE_BYTES)"),
    ],
)
def test_5_validate_refuses_a_device_and_a_file_over_the_size_limit(tmp_path, target, message):
    with open(tmp_path / "huge.json", "wb") as handle:  # sparse: no disk, and no reading it
        handle.truncate(MAX_FILE_BYTES + 1)
    # In a process of bounded memory: a reader without a limit takes all there is (MemoryError, or worse).
    done = placer_process(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from placer.cli import main
        sys.exit(main(["validate", {target!r}]))
        """,
        tmp_path,
    )
    assert done.returncode == 2 and done.stderr.splitlines() == [message], done.stderr


def test_5_a_pipe_is_read_up_to_the_limit(tmp_path):
    fifo = _fifo(tmp_path / "pipe")
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"[" * 100))
    writer.start()
    try:
        with pytest.raises(FormatError, match="larger than the 10 bytes"):
            read_bytes(fifo, "graph file", limit=10)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the writer finish
        writer.join(timeout=10)


# ----------------------------------------------------------------------------- 6
def test_6_sigterm_while_charts_are_drawn_leaves_the_earlier_report_and_nothing_else(tmp_path, graph_file):
    folder = tmp_path / "report"
    compare(OpGraph.load(graph_file), load_cluster("2xcpu"), ["single"], progress=False).write(folder)
    before = contents(folder)
    done = placer_process(
        f"""
        import os, signal, sys
        import placer.report.charts
        from placer.cli import main

        real = placer.report.charts.memory_chart

        def terminated(*args, **kwargs):
            real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)        # `kill`, `timeout`: after a chart is written

        placer.report.charts.memory_chart = terminated
        sys.exit(main(["compare", {str(graph_file)!r}, "--cluster", "2xcpu", "--algorithms", "single,m_etf",
                       "-o", {str(folder)!r}]))
        """,
        tmp_path,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert contents(folder) == before  # no .report-*/ folder, no partial chart, no .tmp
    assert not list((tmp_path / "tmp").glob("placer-*"))  # nor its charts in the temporary folder


# ----------------------------------------------------------------------------- 8
def test_8_names_reach_the_terminal_with_their_control_characters_escaped(tmp_path, capsys):
    evil = "\x1b[2J\x1b]0;pwned\x07"
    graph = training_graph(layers=2, branches=1, name=f"graph{evil}")
    graph = graph.replace(ids=[f"{i}{evil}" for i in graph.ids])
    graph_path = tmp_path / "g.json"
    graph.save(graph_path)
    cluster = Cluster(
        f"box{evil}",
        [Device(f"d0{evil}", "V100", 16 << 30), Device("d1\x9b2J", "V100", 16 << 30)],
        [
            Channel("a", 25e9, 1e-5, ((f"d0{evil}", "d1\x9b2J"),)),
            Channel("b", 25e9, 1e-5, (("d1\x9b2J", f"d0{evil}"),)),
        ],
    )
    cluster_path = tmp_path / "c.json"
    cluster.save(cluster_path)
    plan_path = tmp_path / "p.json"
    shown = ""
    for argv in (
        ["plan", graph_path, "--cluster", cluster_path, "--algorithm", "m_etf", "-o", plan_path],
        ["simulate", graph_path, plan_path, "--cluster", cluster_path],
        ["validate", graph_path, cluster_path, plan_path],
        ["cost", graph_path, "-o", tmp_path / "costed.json"],
        ["compare", graph_path, "--cluster", cluster_path, "--algorithms", "single,m_etf"],
    ):
        status, out, err = run(capsys, *argv)
        assert status == 0, err
        shown += out + err
    assert "graph\\x1b[2J" in shown and "d1\\x9b2J" in shown
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown)


# ----------------------------------------------------------------------------- 9
def test_9_comparison_md_shows_html_in_names_as_text(tmp_path):
    graph = training_graph(layers=2, branches=1, name="<script>alert(1)</script>")
    cluster = load_cluster("2xcpu")
    cluster.name = "<img src=x onerror=alert(2)> [link](javascript:alert(3))"
    paths = compare(graph, cluster, ["single"], progress=False).write(tmp_path)
    text = paths["markdown"].read_text()
    assert "<script" not in text and "<img" not in text and not re.search(r"(?<!\\)\]\(javascript", text)
    assert text.splitlines()[0] == (
        "# &lt;script&gt;alert(1)&lt;/script&gt; on &lt;img src=x onerror=alert(2)&gt; \\[link\\](javascript:alert(3))"
    )


# ----------------------------------------------------------------------------- 10
def test_10_a_long_value_in_an_error_is_cut_with_an_ellipsis(tmp_path, capsys):
    doc = training_graph(layers=2, branches=1).to_dict()
    long_id = "n" * 200_000
    doc["nodes"][0]["id"] = doc["nodes"][1]["id"] = long_id
    path = _save(doc, tmp_path / "dup.json")
    status, _, err = run(capsys, "validate", path)
    assert status == 2 and len(err.splitlines()) == 1
    assert len(err) < 1000 and "duplicate node id 'nnnn" in err and "... (200,002 characters)" in err


# ----------------------------------------------------------------------------- 11
def _nested(tmp_path: Path, depth: int) -> Path:
    doc = training_graph(layers=2, branches=1).to_dict()
    value: object = 0
    for _ in range(depth):
        value = [value]
    doc["nodes"][0]["deep"] = value
    return _save(doc, tmp_path / f"deep{depth}.json")


def test_11_every_command_reads_to_one_nesting_limit(tmp_path, capsys):
    deep, fine = _nested(tmp_path, MAX_NESTING + 50), _nested(tmp_path, MAX_NESTING - 10)
    commands = [
        lambda g: ["validate", g],
        lambda g: ["cost", g, "-o", tmp_path / "c.json"],
        lambda g: ["plan", g, "--cluster", "2xcpu", "--algorithm", "m_etf", "-o", tmp_path / "p.json"],
    ]
    for command in commands:
        status, _, err = run(capsys, *command(deep))
        assert status == 2 and f"nested too deeply (more than {MAX_NESTING} levels" in err, err
        status, _, err = run(capsys, *command(fine))
        assert status == 0, err


# ----------------------------------------------------------------------------- 12
@pytest.mark.parametrize("where", ["factory", "module"])
def test_12_a_model_that_calls_sys_exit_is_an_error_that_says_so(tmp_path, capsys, where):
    model = tmp_path / "model.py"
    exit_line = "import sys\nsys.exit(3)\n" if where == "module" else ""
    model.write_text(f"{exit_line}def make(batch):\n    import sys\n    sys.exit(3)\n")
    status, _, err = run(capsys, "capture", f"{model}:make", "--batch", "2", "-o", tmp_path / "g.json")
    assert status == 2 and len(err.splitlines()) == 1
    assert "exited (sys.exit(3))" in err and ("importing it" in err if where == "module" else "factory 'make'" in err)


# ----------------------------------------------------------------- what held
def test_held_a_policy_file_is_loaded_without_running_its_code(tmp_path):
    import torch

    from placer.learn.policy import PlacetoPolicy

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return Path.touch, (marker,)

    path = tmp_path / "policy.pt"
    torch.save({"config": Payload(), "state_dict": {}}, path)
    with pytest.raises(FormatError, match="not a policy written by placer train"):
        PlacetoPolicy.load(path)
    assert not marker.exists()


def test_held_report_html_escapes_every_name(tmp_path):
    graph = training_graph(layers=2, branches=1, name="<script>g</script>")
    cluster = Cluster(
        "<b>c</b>",
        [Device("<i>d0</i>", "V100", 16 << 30), Device("d1", "V100", 16 << 30)],
        [Channel("x", 25e9, 1e-5, (("<i>d0</i>", "d1"),)), Channel("y", 25e9, 1e-5, (("d1", "<i>d0</i>"),))],
    )
    html = compare(graph, cluster, ["single"], progress=False).write(tmp_path)["html"].read_text()
    assert "<script>g" not in html and "<b>c" not in html and "<i>d0" not in html


def test_held_a_plan_of_another_graph_is_refused(tmp_path, capsys, graph_file):
    plan = place(training_graph(layers=2, branches=1, seed=9), load_cluster("2xcpu"), "m_etf")
    plan.save(tmp_path / "p.json")
    status, _, err = run(capsys, "validate", tmp_path / "p.json", "--graph", graph_file)
    assert status == 2 and "made for another graph" in err
