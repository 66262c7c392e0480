"""placer.plan(): from a PyTorch model to a checked plan, its report, and a placed training step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import placer
from placer.api import apply, describe, validate
from placer.cli import main
from placer.errors import OptionError, PlacerError
from placer.generate import training_graph


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.body(x)), y)


def _model_and_inputs():
    torch.manual_seed(0)
    return TinyNet(), (torch.randn(6, 8), torch.randint(0, 3, (6,)))


def test_plan_from_a_module_reports_and_trains_like_eager():
    model, inputs = _model_and_inputs()
    plan = placer.plan(model, inputs, cluster="2xcpu", algorithm="round_robin", optimizer="sgd", lr=0.1)
    graph, cluster = plan.context["graph"], plan.context["cluster"]
    assert set(plan.placement) == set(graph.ids) and len(set(plan.placement.values())) == 2
    assert plan.predicted["makespan_s"] == pytest.approx(placer.simulate_plan(plan, graph, cluster).makespan_s)
    assert "cpu0" in describe(plan) and "cpu1" in describe(plan)

    reference = copy.deepcopy(model)
    step = apply(plan, model, torch.optim.SGD(model.parameters(), lr=0.1))
    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        placed_loss = step(*inputs)
        eager_opt.zero_grad()
        eager_loss = reference(*inputs)
        eager_loss.backward()
        eager_opt.step()
        assert float(placed_loss) == pytest.approx(eager_loss.item(), abs=1e-6)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_plan_from_a_spec_and_from_a_graph():
    plan = placer.plan("zoo:lenet", batch=4, cluster="2xcpu", algorithm="expert")
    assert plan.predicted["fits"] and plan.context["captured"] is not None
    again = placer.plan(plan.context["graph"], cluster="2xcpu", algorithm="expert")
    assert again.placement == plan.placement


def test_plan_refuses_missing_inputs_and_batch():
    with pytest.raises(OptionError, match="needs example inputs"):
        placer.plan(TinyNet(), cluster="2xcpu")
    with pytest.raises(OptionError, match="needs batch=N"):
        placer.plan("zoo:lenet", cluster="2xcpu")


def test_cli_plans_and_compares_a_model_spec(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert (
        main(["plan", "zoo:lenet", "--batch", "4", "--cluster", "2xcpu", "--algorithm", "expert", "-o", str(out)]) == 0
    )
    assert placer.Plan.load(out).placement
    assert (
        main(["compare", "zoo:lenet", "--batch", "4", "--cluster", "2xcpu", "--algorithms", "expert,round_robin"]) == 0
    )
    assert "round_robin" in capsys.readouterr().out
    assert main(["plan", "zoo:lenet", "--cluster", "2xcpu", "-o", str(out)]) == 2
    assert "needs --batch N" in capsys.readouterr().err


def test_plan_checks_its_arguments_before_capturing(tmp_path, monkeypatch):
    # A capture takes minutes for a large model: a misspelt algorithm, cluster, option or profile was
    # reported only after it.
    import placer.capture.spec

    monkeypatch.setattr(
        placer.capture.spec,
        "capture_spec",
        lambda *args, **kwargs: pytest.fail("captured before checking the arguments"),
    )
    for arguments, message in [
        ({"algorithm": "nope"}, "unknown algorithm 'nope'"),
        ({"cluster": "3xfoo"}, "unknown cluster '3xfoo'"),
        ({"algorithm": "expert", "seed": -1}, "option seed must be"),
        ({"algorithm": "expert", "depth": 3}, "has no option 'depth'"),
        ({"profile": tmp_path / "missing.json"}, "missing.json: no such file"),
    ]:
        with pytest.raises(PlacerError, match=message):
            placer.plan("zoo:resnet50", batch=64, **{"cluster": "2xcpu", **arguments})


def test_plan_refuses_arguments_it_would_ignore():
    graph = training_graph(layers=2, branches=2)
    model, inputs = _model_and_inputs()
    for call, message in [
        (lambda: placer.plan(graph, batch=64), "batch= is for a model to capture"),
        (lambda: placer.plan(graph, inputs), "inputs is for a model to capture"),
        (lambda: placer.plan("zoo:lenet", inputs, batch=4), "a model spec makes its own inputs"),
        (lambda: placer.plan(model, inputs, batch=64), "a module's batch is that of its inputs"),
        (lambda: placer.plan(None), "must be a torch.nn.Module, a model spec .* got NoneType"),
    ]:
        with pytest.raises(OptionError, match=message):
            call()


def test_runnable_is_deprecated_and_has_no_effect():
    # runnable=True once kept plans to those without data-parallel replicas, which the runtime now runs too:
    # it warns, refuses no algorithm or option, and changes no plan.
    from placer.transform.replicate import replicated_node

    graph = placer.plan(*_model_and_inputs(), cluster="2xcpu", algorithm="expert").context["graph"]
    for algorithm, options in (("data_parallel", {}), ("os_dpos", {"data_parallel_start": True, "seed": 0})):
        with pytest.warns(DeprecationWarning, match="runnable is deprecated and has no effect: every plan runs"):
            plan = placer.plan(graph, cluster="2xcpu", algorithm=algorithm, runnable=True, **options)
        assert plan.placement == placer.plan(graph, cluster="2xcpu", algorithm=algorithm, **options).placement
        if algorithm == "data_parallel":
            assert replicated_node(plan.rewritten_graph) is not None
    with pytest.warns(DeprecationWarning, match="runnable is deprecated"):
        placer.plan(graph, cluster="2xcpu", algorithm="expert", runnable=False)


def test_failure_messages_name_the_algorithm_once():
    from placer.algorithms.registry import failure_message

    assert (
        failure_message("pesto", TimeoutError("pesto found no plan within its time limit"))
        == "pesto found no plan within its time limit"
    )
    assert failure_message("pesto", ValueError("pesto: no solver")) == "pesto: no solver"
    assert failure_message("pesto", ValueError("pestos are green")) == "pesto: pestos are green"
    assert failure_message("pesto", ValueError("option x of 'pesto' must be")) == "option x of 'pesto' must be"
    # An option a transform checks where it is used: its message did not say which algorithm had it.
    with pytest.raises(OptionError, match="^celeritas: option exploration_range must be an integer >= 1"):
        placer.place(training_graph(layers=2), placer.load_cluster("2xcpu"), "celeritas", exploration_range=0)


def test_a_plan_from_place_reports_without_arguments_and_an_overflowing_plan_says_so():
    from placer.cluster import Channel, Cluster, Device

    graph = training_graph(layers=2, branches=2)
    plan = placer.place(graph, placer.load_cluster("2xcpu"), "expert")
    assert "cpu0" in describe(plan)  # it needed report(graph, cluster) but from placer.plan
    # The same plan on two 1-MiB devices: reported with its fits column, where it raised.
    small = Cluster(
        "small",
        [Device(f"cpu{j}", "cpu", 1 << 20) for j in range(2)],
        [Channel(f"cpu{a}->cpu{b}", 1e9, 1e-5, ((f"cpu{a}", f"cpu{b}"),)) for a, b in ((0, 1), (1, 0))],
    )
    overflowing = placer.Plan(plan.placement, plan.order, graph_name=graph.name)
    assert "fits: False" in describe(overflowing, graph, small)
    with pytest.raises(placer.errors.InvalidPlanError, match=r"needs \d+\.\d MiB at peak but has 1\.0 MiB"):
        validate(overflowing, graph, small)
