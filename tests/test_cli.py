"""The placer command: plan, simulate, validate, algorithms, demo; user errors exit 2 on one line."""

import json
import subprocess
import sys
import warnings

import pytest

from placer.cli import main
from placer.generate import training_graph

from .reference_model import close, reference_simulate


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "g.json"
    training_graph(layers=3, branches=2, seed=3).save(path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_warns_that_runnable_is_deprecated_and_notes_no_replicas(tmp_path, capsys, graph_file, recwarn):
    # `placer run` runs data-parallel plans too: a plan with replicas needs no note, and auto's runnable
    # option (which once kept them out) does nothing but warn, once.
    code, out, err = run(
        capsys,
        "plan",
        graph_file,
        "--cluster",
        "2xV100-nvlink",
        "--algorithm",
        "data_parallel",
        "-o",
        tmp_path / "p.json",
    )
    assert code == 0 and err == "", err
    code, out, err = run(
        capsys,
        "plan",
        graph_file,
        "--cluster",
        "2xV100-nvlink",
        "--algorithm",
        "auto",
        "--option",
        "runnable=true",
        "--option",
        "max_evaluations=5",
        "-o",
        tmp_path / "a.json",
    )
    assert code == 0 and "placer: warning: option runnable is deprecated and has no effect" in err, err
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("algorithm", ["single", "round_robin", "expert", "metis"])
def test_plan_then_simulate_json_agrees_with_reference(tmp_path, capsys, graph_file, algorithm):
    plan_file = tmp_path / "p.json"
    code, out, err = run(
        capsys, "plan", graph_file, "--cluster", "4xV100-nvlink", "--algorithm", algorithm, "-o", plan_file, "--seed", 1
    )
    assert code == 0, err
    code, out, err = run(capsys, "simulate", graph_file, plan_file, "--cluster", "4xV100-nvlink", "--json")
    assert code == 0, err
    report = json.loads(out)
    plan = json.loads(plan_file.read_text())
    from placer.cluster import load_cluster

    ref = reference_simulate(
        json.loads(graph_file.read_text()), load_cluster("4xV100-nvlink").to_dict(), plan["placement"], plan["order"]
    )
    assert close(report["makespan_s"], ref["makespan_s"], rel=1e-6)
    assert close(plan["predicted"]["makespan_s"], ref["makespan_s"], rel=1e-6)
    assert report["peak_memory_bytes"] == ref["peak_memory_bytes"]
    assert report["fits"] is True and report["lower_bound_s"] <= report["makespan_s"]


def test_long_steps_say_what_they_do_on_stderr_and_leave_a_pipe_clean(capsys):
    from placer.report.tables import working

    with working("planning ..."):  # a spinner: drawn on a terminal only
        print("result")
    with working("timing ...", measuring=True):  # a line: no drawing thread beside what is timed
        pass
    out = capsys.readouterr()
    assert out.out == "result\n" and out.err == "timing ...\n"


def test_simulate_writes_a_trace(tmp_path, capsys, graph_file):
    plan_file, trace = tmp_path / "p.json", tmp_path / "t.json"
    assert run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "-o", plan_file)[0] == 0
    code, out, _ = run(capsys, "simulate", graph_file, plan_file, "--trace", trace)
    assert code == 0 and "makespan" in out
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    transfers = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert len(ops) == training_graph(layers=3, branches=2, seed=3).num_nodes
    assert transfers, "the expert split on two devices sends tensors"


def test_simulate_says_a_plan_without_its_order_may_have_been_edited(tmp_path, capsys, graph_file):
    # The note blamed other costs (a --profile) alone, where the order had been removed by hand.
    plan_file = tmp_path / "p.json"
    assert run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "--algorithm", "heft", "-o", plan_file)[0] == 0
    doc = json.loads(plan_file.read_text())
    doc.pop("order")
    plan_file.write_text(json.dumps(doc))
    code, _, err = run(capsys, "simulate", graph_file, plan_file)  # earliest-ready dispatch: another step
    assert code == 0 and "or edited since (it has no order now: was it removed?)" in err


def test_simulate_with_a_calibrated_message_cost(tmp_path, capsys, graph_file):
    from placer.cluster import load_cluster
    from placer.graph import OpGraph
    from placer.harness.calibrate import Calibration, LinkFit
    from placer.plan import Plan
    from placer.sim import simulate_plan
    from placer.sim.messages import MessageCost, messages_graph

    plan_file, calibration = tmp_path / "p.json", tmp_path / "cal.json"
    assert run(capsys, "plan", graph_file, "--cluster", "2xcpu", "--algorithm", "round_robin", "-o", plan_file)[0] == 0
    cost = MessageCost(50e-6, 1e-10, 30e-6, 0.0)
    Calibration({"gloo": LinkFit(3e-5, 4e9, 1.0)}, {}, cost, [(0, 1, 1024, 50e-6, 30e-6)], 4e-4).save(calibration)
    code, out, err = run(capsys, "simulate", graph_file, plan_file, "--message-cost", calibration, "--json")
    assert code == 0, err
    report = json.loads(out)
    graph, plan, cluster = OpGraph.load(graph_file), Plan.load(plan_file), load_cluster("2xcpu")
    expected = simulate_plan(plan, messages_graph(graph, plan.bind(graph, cluster), cluster, {}, cost), cluster)
    assert report["with_message_cost_s"] == pytest.approx(expected.makespan_s + 4e-4, rel=1e-12)  # and the barrier
    assert report["with_message_cost_s"] > report["makespan_s"]  # round robin sends between its devices
    code, out, _ = run(capsys, "simulate", graph_file, plan_file, "--message-cost", calibration)
    assert code == 0 and "with the host cost of its messages" in out
    Calibration({"gloo": LinkFit(3e-5, 4e9, 1.0)}).save(calibration)
    code, _, err = run(capsys, "simulate", graph_file, plan_file, "--message-cost", calibration)
    assert code == 2 and "has no message cost" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "{graph}", "--cluster", "nope", "-o", "{out}"], "unknown cluster 'nope'"),
        (
            ["plan", "{graph}", "--cluster", "2xV100-nvlink", "--algorithm", "nope", "-o", "{out}"],
            "unknown algorithm 'nope'",
        ),
        (["plan", "{graph}", "--cluster", "2xV100-nvlink", "--option", "x=1", "-o", "{out}"], "has no option 'x'"),
        (
            ["plan", "{graph}", "--cluster", "2xV100-nvlink", "--time-limit", "-1", "-o", "{out}"],
            "option '--time-limit' must be",
        ),
        (["plan", "{missing}", "--cluster", "2xV100-nvlink", "-o", "{out}"], "no such file"),
        (
            ["plan", "{big}", "--cluster", "2xV100-nvlink", "--algorithm", "single", "-o", "{out}"],
            "single: no one device",
        ),
    ],
)
def test_user_errors_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, graph_file, argv, message):
    big = tmp_path / "big.json"
    training_graph(layers=4, branches=2, param_mib=2000).save(big)
    out = tmp_path / "out.json"
    args = [a.format(graph=graph_file, out=out, missing=tmp_path / "missing.json", big=big) for a in argv]
    code, stdout, err = run(capsys, *args)
    assert code == 2
    assert err.startswith("placer: error: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err
    assert not out.exists()
    assert not list(tmp_path.glob(".out.json*")), "no temporary file is left behind"


def test_validate(tmp_path, capsys, graph_file):
    plan_file = tmp_path / "p.json"
    run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "-o", plan_file)
    code, out, _ = run(capsys, "validate", graph_file, plan_file, "--graph", graph_file)
    assert code == 0 and "valid graph" in out and "valid plan" in out
    doc = json.loads(plan_file.read_text())
    doc["placement"].pop("input")
    plan_file.write_text(json.dumps(doc))
    code, _, err = run(capsys, "validate", plan_file, "--graph", graph_file)
    assert code == 2 and "unplaced" in err


def test_algorithms_and_clusters_list(capsys):
    code, out, _ = run(capsys, "algorithms")
    assert code == 0 and "expert" in out and "metis" in out
    code, out, _ = run(capsys, "clusters")
    assert code == 0 and "8xH100-nvswitch" in out


def test_installed_command_runs_demo(tmp_path):
    # The demo's own path on a small model; the full default (inception_v3) runs in bench/quality.py's time.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "placer",
            "demo",
            "-o",
            str(tmp_path / "demo"),
            "--model",
            "zoo:lenet",
            "--batch",
            "64",
            "--cluster",
            "2xcpu",
            "--time-limit",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "best:" in done.stdout
    assert (tmp_path / "demo" / "graph.json").exists()
    # Then it trains auto's plan of a small model on two CPU ranks, checked against torch's DDP.
    assert "simulator predicts" in done.stdout and "equal torch DDP" in done.stdout
    assert (tmp_path / "demo" / "train-plan.json").exists()


def test_a_demo_whose_report_fails_leaves_no_lone_graph(tmp_path, monkeypatch):
    from placer.cli.demo import run_demo
    from placer.report.compare import Comparison

    def fail(self, folder):
        raise OSError("disk full")

    monkeypatch.setattr(Comparison, "write", fail)
    with pytest.raises(OSError, match="disk full"):
        run_demo(tmp_path / "demo", model="zoo:lenet", batch=2, cluster="2xcpu", algorithms=["single"], time_limit=2)
    assert not (tmp_path / "demo" / "graph.json").exists()


def test_simulate_takes_the_model_spec_a_plan_was_made_from(tmp_path, capsys):
    plan_file = tmp_path / "p.json"
    spec = ["zoo:lenet", "--batch", "8", "--optimizer", "sgd"]
    assert (
        run(capsys, "plan", *spec[:1], "--cluster", "2xcpu", "--algorithm", "round_robin", "-o", plan_file, *spec[1:])[
            0
        ]
        == 0
    )
    code, out, err = run(capsys, "simulate", spec[0], plan_file, *spec[1:], "--json")
    assert code == 0, err
    assert close(json.loads(out)["makespan_s"], json.loads(plan_file.read_text())["predicted"]["makespan_s"], rel=1e-9)
    code, _, err = run(capsys, "simulate", spec[0], plan_file, "--batch", "16", "--optimizer", "sgd")
    assert code == 2 and "made for graph 'lenet-bs8-sgd', not 'lenet-bs16-sgd'" in err
    code, _, err = run(capsys, "simulate", spec[0], plan_file)
    assert code == 2 and "needs --batch" in err
    graph_file = tmp_path / "g.json"
    assert run(capsys, "capture", *spec, "-o", graph_file)[0] == 0
    code, _, err = run(capsys, "simulate", graph_file, plan_file, "--batch", "16")
    assert code == 2 and "--batch applies to a model spec" in err


def test_a_plan_of_a_graph_captured_under_a_name_applies_to_the_spec_with_that_name(tmp_path, capsys):
    graph_file, plan_file = tmp_path / "g.json", tmp_path / "p.json"
    spec = ["zoo:lenet", "--batch", "4", "--optimizer", "sgd"]
    assert run(capsys, "capture", *spec, "--name", "mynet", "-o", graph_file)[0] == 0
    assert run(capsys, "plan", graph_file, "--cluster", "2xcpu", "--algorithm", "expert", "-o", plan_file)[0] == 0
    code, _, err = run(capsys, "simulate", *spec, plan_file)
    assert code == 2 and "made for graph 'mynet', not 'lenet-bs4-sgd' (the same operations" in err
    code, out, err = run(capsys, "simulate", *spec, plan_file, "--name", "mynet", "--json")
    assert code == 0, err
    assert close(json.loads(out)["makespan_s"], json.loads(plan_file.read_text())["predicted"]["makespan_s"], rel=1e-9)
    code, out, err = run(
        capsys, "run", spec[0], *spec[1:], "--plan", plan_file, "--name", "mynet", "--steps", "2", "--lr", "0.001"
    )
    assert code == 0 and "mynet on 2xcpu" in out, err
    code, _, err = run(capsys, "simulate", graph_file, plan_file, "--name", "mynet")
    assert code == 2 and "--name applies to a model spec" in err


@pytest.fixture
def planned(tmp_path, capsys, graph_file):
    """A plan of ``graph_file`` made on a cluster file named like the preset 2xV100-nvlink but 100x slower."""
    from placer.cluster import load_cluster

    doc = load_cluster("2xV100-nvlink").to_dict()
    for channel in doc["channels"]:
        channel["bandwidth_bytes_per_s"] = 25e7
    slow, plan_file = tmp_path / "slow.json", tmp_path / "p.json"
    slow.write_text(json.dumps(doc))
    assert run(capsys, "plan", graph_file, "--cluster", slow, "--algorithm", "round_robin", "-o", plan_file)[0] == 0
    return slow, plan_file


def test_a_plan_is_checked_on_the_cluster_it_was_made_for(tmp_path, capsys, graph_file, planned):
    slow, plan_file = planned
    for argv in (
        ["simulate", graph_file, plan_file],
        ["validate", plan_file, "--graph", graph_file],
        ["run", "zoo:lenet", "--plan", plan_file],
    ):
        code, _, err = run(capsys, *argv)  # not the preset of that name, with other figures
        assert code == 2 and err.count("\n") == 1, err
        assert f"plan {plan_file} was made for cluster '2xV100-nvlink' (its \"cluster\" field)" in err
        assert "pass --cluster FILE" in err
    code, out, err = run(capsys, "simulate", graph_file, plan_file, "--cluster", slow, "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["makespan_s"] == pytest.approx(json.loads(plan_file.read_text())["predicted"]["makespan_s"])
    # Another cluster on purpose: a note, not an error.
    code, out, err = run(capsys, "simulate", graph_file, plan_file, "--cluster", "2xV100-nvlink", "--json")
    assert code == 0 and json.loads(out)["makespan_s"]
    assert err.startswith("placer: note: ") and err.count("\n") == 1 and "figures differ" in err
    # A plan made for a cluster file named as no preset and no file.
    doc = json.loads(slow.read_text())
    doc["name"] = "mybox"
    slow.write_text(json.dumps(doc))
    assert run(capsys, "plan", graph_file, "--cluster", slow, "-o", plan_file)[0] == 0
    code, _, err = run(capsys, "validate", plan_file, "--graph", graph_file)
    assert code == 2 and "made for cluster 'mybox' (its \"cluster\" field), which is no preset and no file" in err
    # Plans from before the digest was recorded still find their cluster by name.
    assert run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "-o", plan_file)[0] == 0
    doc = json.loads(plan_file.read_text())
    doc.pop("cluster_digest")
    plan_file.write_text(json.dumps(doc))
    code, out, err = run(capsys, "simulate", graph_file, plan_file)
    assert code == 0 and err == "" and "makespan" in out


def test_validate_on_another_cluster_checks_it_there_and_says_the_plan_was_made_for_another(
    graph_file, capsys, planned
):
    slow, plan_file = planned
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the note, not a Python warning besides
        code, out, err = run(capsys, "validate", plan_file, "--graph", graph_file, "--cluster", "2xV100-nvlink")
    assert code == 0 and out.startswith(f"{plan_file}: valid plan, makespan ")
    assert err == (
        f"placer: note: plan {plan_file} was made for cluster '2xV100-nvlink', whose figures differ from "
        f"those of --cluster 2xV100-nvlink\n"
    )


def test_simulate_errors_name_the_plan_file_and_its_cluster(tmp_path, capsys, graph_file):
    plan_file = tmp_path / "p.json"
    assert run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "-o", plan_file)[0] == 0
    code, _, err = run(capsys, "simulate", graph_file, plan_file, "--cluster", "2xcpu")
    note, error = err.splitlines()  # the note that the cluster differs, then the error
    assert code == 2 and note.startswith("placer: note: ") and error.startswith(f"placer: error: {plan_file}: node ")
    assert error.endswith("(the plan was made for cluster '2xV100-nvlink', not '2xcpu')")
    doc = json.loads(plan_file.read_text())
    doc["placement"].pop("input")
    plan_file.write_text(json.dumps(doc))
    code, _, err = run(capsys, "simulate", graph_file, plan_file)
    assert code == 2 and err == f"placer: error: {plan_file}: the plan leaves 1 node(s) unplaced, e.g. 'input'\n"
    doc["placement"]["input"] = "gpu0"
    doc["splits"] = [{"node": "ghost", "dim": "batch", "parts": 2}]
    plan_file.write_text(json.dumps(doc))
    code, _, err = run(capsys, "simulate", graph_file, plan_file)
    assert code == 2 and err == f"placer: error: {plan_file}: splits[0] names unknown node 'ghost'\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "{graph}", "--cluster", "2xcpu", "-o", "{dir}"], "cannot write plan file {dir}: is a directory"),
        (
            ["plan", "{graph}", "--cluster", "2xcpu", "-o", "{graph}/p.json"],
            "cannot write plan file {graph}/p.json: {graph} is a file, not a folder",
        ),
        (["plan", "{graph}", "--cluster", "2xcpu", "-o", ""], "cannot write plan file '': the path is empty"),
        (
            ["plan", "{graph}", "--cluster", "2xcpu", "-o", "{graph}"],
            "plan file {graph} is the input file {graph}; pick another output",
        ),
        (["simulate", "{graph}", "{plan}", "--trace", "{dir}"], "cannot write trace file {dir}: is a directory"),
        (
            ["compare", "{graph}", "--cluster", "2xcpu", "-o", "{graph}"],
            "cannot write report folder {graph}: it is a file, not a folder",
        ),
        (["cost", "{graph}", "-o", "{dir}"], "cannot write graph file {dir}: is a directory"),
        (["capture", "zoo:lenet", "--batch", "2", "-o", "{dir}"], "cannot write graph file {dir}: is a directory"),
        (["demo", "-o", "{graph}"], "cannot write report folder {graph}: it is a file, not a folder"),
    ],
)
def test_output_paths_are_checked_before_the_work(tmp_path, capsys, monkeypatch, graph_file, argv, message):
    import placer.algorithms
    import placer.capture
    import placer.capture.spec
    import placer.report.compare

    plan_file, folder = tmp_path / "p.json", tmp_path / "adir"
    assert run(capsys, "plan", graph_file, "--cluster", "2xcpu", "-o", plan_file)[0] == 0
    folder.mkdir()
    before = graph_file.read_text()

    def never(*args, **kwargs):
        raise AssertionError("the work ran before the output path was checked")

    for module, name in (
        (placer.algorithms, "place"),
        (placer.report.compare, "place"),
        (placer.capture, "capture_spec"),
        (placer.capture.spec, "capture_spec"),
    ):
        monkeypatch.setattr(module, name, never)
    code, _, err = run(capsys, *[a.format(graph=graph_file, plan=plan_file, dir=folder) for a in argv])
    assert code == 2 and err == "placer: error: " + message.format(graph=graph_file, dir=folder) + "\n"
    assert graph_file.read_text() == before and not list(folder.iterdir())


def test_validate_checks_every_file_and_takes_a_model_spec(tmp_path, capsys, graph_file):
    plan_file, broken = tmp_path / "p.json", tmp_path / "broken.json"
    assert run(capsys, "plan", graph_file, "--cluster", "2xV100-nvlink", "-o", plan_file)[0] == 0
    broken.write_text('{"format": ')
    code, out, err = run(capsys, "validate", graph_file, broken, plan_file, "--graph", graph_file)
    assert code == 2
    assert out.splitlines()[0].startswith(f"{graph_file}: valid graph")
    assert out.splitlines()[1].startswith(f"{plan_file}: valid plan")
    assert err == f"placer: error: file {broken}: invalid JSON at line 1 column 12: Expecting value\n"
    code, _, err = run(capsys, "validate", plan_file, "--cluster", "2xV100-nvlink")
    assert code == 2 and "option '--cluster' checks plans against a cluster, which needs '--graph' too" in err
    for flags in (["--batch", "2"], ["--momentum", "0.9"], ["--nesterov"]):  # were ignored without --graph
        code, _, err = run(capsys, "validate", plan_file, *flags)
        assert code == 2 and f"option '{flags[0]}' shapes the step captured from a model spec" in err
    lenet = tmp_path / "lenet.json"
    assert run(capsys, "plan", "zoo:lenet", "--batch", "2", "--cluster", "2xcpu", "-o", lenet)[0] == 0
    code, out, err = run(capsys, "validate", lenet, "--graph", "zoo:lenet", "--batch", "2")
    assert code == 0 and "valid plan" in out, err


@pytest.mark.parametrize(
    "option, message",
    [
        (["--algorithms", ",,"], "option '--algorithms' names no algorithm: ',,'"),
        (
            ["--algorithms", "single,expert,single"],
            "option '--algorithms' names 'single' twice (one row and one plan file each)",
        ),
        (["--time-limit", "-1"], "option '--time-limit' must be a positive number of seconds, got -1"),
        (["--seed", "-1"], "option '--seed' must be a non-negative integer, got -1"),
    ],
)
def test_compare_refuses_bad_options_up_front(capsys, monkeypatch, graph_file, option, message):
    import placer.report.compare

    monkeypatch.setattr(placer.report.compare, "place", lambda *a, **k: pytest.fail("an algorithm ran"))
    code, out, err = run(capsys, "compare", graph_file, "--cluster", "2xcpu", *option)
    assert code == 2 and out == "" and err == f"placer: error: {message}\n"


@pytest.mark.parametrize(
    "option, message",
    [
        (["--time-limit", "0"], "option '--time-limit' must be a positive number of seconds, got 0"),
        (["--seed", "-2"], "option '--seed' must be a non-negative integer, got -2"),
        (["--option", "x=1"], "algorithm 'expert' has no option 'x'"),
        (["--seed", "1", "--option", "seed=2"], "--option seed=... and --seed both set seed: give one"),
        (["--algorithm", "m_etf", "--option", "coplace=3"], "option coplace of 'm_etf' must be true or false"),
        (
            ["--algorithm", "1f1b", "--microbatches", "2", "--option", "microbatches=2"],
            "--option microbatches=... and --microbatches both set microbatches: give one",
        ),
    ],
)
def test_plan_refuses_bad_options_before_capturing_the_model(tmp_path, capsys, monkeypatch, option, message):
    import placer.capture

    monkeypatch.setattr(placer.capture, "capture_spec", lambda *a, **k: pytest.fail("the model was captured"))
    code, out, err = run(
        capsys, "plan", "zoo:lenet", "--batch", "2", "--cluster", "2xcpu", "-o", tmp_path / "p.json", *option
    )
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_compare_on_a_graph_with_no_compute_writes_the_whole_report(tmp_path, capsys, monkeypatch):
    from placer.cluster import load_cluster
    from placer.graph import OpGraph
    from placer.report.compare import Comparison, compare

    g = training_graph(layers=2, branches=1, seed=3)
    zero = tmp_path / "zero.json"
    OpGraph.from_dict({**g.to_dict(), "nodes": [{**n, "compute_s": 0} for n in g.to_dict()["nodes"]]}).save(zero)
    code, out, err = run(
        capsys, "compare", zero, "--cluster", "2xcpu", "--algorithms", "single,expert", "-o", tmp_path / "report"
    )
    assert code == 0, err
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "plan-expert.json").exists()
    # A late error leaves no half-written folder.
    comparison = compare(g, load_cluster("2xcpu"), ["single"], progress=False)
    monkeypatch.setattr(Comparison, "to_dict", lambda self: {"bad": float("inf")})
    with pytest.raises(ValueError):
        comparison.write(tmp_path / "late")
    assert not (tmp_path / "late").exists()


def test_a_reader_that_leaves_early_gets_no_traceback():
    import subprocess
    import sys

    # `placer clusters | head -1`: the pipe closes while the table is written.
    proc = subprocess.Popen(
        [sys.executable, "-m", "placer", "clusters"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err, err


def test_ctrl_c_while_the_commands_load_ends_with_status_130(capsys, monkeypatch):
    """The command modules import torch before any command runs: Ctrl-C then is an interrupt, not a traceback."""
    import placer.cli.core

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(placer.cli.core, "build_parser", interrupted)
    code, out, err = run(capsys, "algorithms")
    assert code == 130 and out == "" and err == "placer: interrupted\n"


def test_plan_takes_a_pipelines_micro_batches_as_an_option_too(tmp_path, capsys):
    """``--option microbatches=M`` of a pipeline is ``--microbatches M`` (it crashed with a TypeError), with
    the pipeline's other options: two replica groups of two devices."""
    code, _, err = run(
        capsys,
        "plan",
        "zoo:lenet",
        "--batch",
        "8",
        "--cluster",
        "4xcpu",
        "--algorithm",
        "1f1b",
        "--option",
        "microbatches=4",
        "--option",
        "replicas=2",
        "-o",
        tmp_path / "p.json",
    )
    assert code == 0, err
    from placer.plan import Plan

    plan = Plan.load(tmp_path / "p.json")
    assert plan.extra["microbatches"] == 4 and plan.extra["replicas"] == 2 and len(plan.extra["groups"]) == 2
