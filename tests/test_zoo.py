"""The model zoo: tiny models train, full-size models match published sizes, meta builds are free."""

import pytest
import torch
import torch.nn.functional as F

from placer.capture.zoo import ZOO
from placer.capture.zoo.blocks import MultiHeadAttention, StackedLSTM
from placer.errors import OptionError

PUBLISHED_PARAMETERS = {
    # torchvision / paper figures, in parameters
    "lenet": 61_706,  # LeCun et al. (1998), LeNet-5
    "alexnet": 61_100_840,  # torchvision alexnet
    "vgg19": 143_667_240,  # torchvision vgg19
    "resnet50": 25_557_032,  # torchvision resnet50
    "resnet101": 44_549_160,  # torchvision resnet101
    "resnet152": 60_192_808,  # torchvision resnet152
    "inception_v3": 27_161_264,  # torchvision inception_v3 with the auxiliary head
    "bert_large": 335_174_458,  # BERT-large encoder (no pooler) + masked-LM head; Devlin et al.: 340M
    "gpt2": 124_439_808,  # GPT-2 small (HF gpt2), output tied to the embedding
}


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta(name: str, **options):
    with torch.device("meta"):
        return ZOO[name].factory(2, **options)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_tiny_model_trains(name):
    entry = ZOO[name]
    model, inputs = entry.factory(2, **entry.tiny)
    loss = model(*inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing[:5]}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(ZOO))
def test_building_is_deterministic(name):
    entry = ZOO[name]
    before = torch.random.get_rng_state()
    (model_a, inputs_a), (model_b, inputs_b) = entry.factory(2, **entry.tiny), entry.factory(2, **entry.tiny)
    assert torch.equal(torch.random.get_rng_state(), before), "a factory must not move the caller's RNG"
    for a, b in zip(
        list(model_a.state_dict().values()) + list(inputs_a), list(model_b.state_dict().values()) + list(inputs_b)
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_full_size_on_meta_allocates_nothing_and_trains(name):
    model, inputs = _meta(name)
    tensors = list(model.parameters()) + list(model.buffers()) + list(inputs)
    assert tensors and all(t.is_meta for t in tensors)
    assert all(t.shape[0] == 2 for t in inputs)
    loss = model(*inputs)  # shapes of the paper configuration (aux heads included) line up
    assert loss.is_meta and loss.dim() == 0
    loss.backward()
    assert all(p.grad is not None and p.grad.is_meta for p in model.parameters())
    assert ZOO[name].paper_batch >= 1 and ZOO[name].description and ZOO[name].reference


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_full_size_matches_published_parameter_count(name):
    model, _ = _meta(name)
    assert _parameters(model) == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.01)


def test_inception_without_aux_head():
    model, _ = _meta("inception_v3", aux=False)
    assert _parameters(model) == 23_834_568  # torchvision inception_v3(aux_logits=False)


def test_nasnet_large_without_aux_head():
    model, _ = _meta("nasnet", aux=False)
    assert _parameters(model) == 88_753_150  # Keras NASNetLarge, trainable parameters


def test_gpt2_output_projection_is_the_token_embedding():
    model, _ = _meta("gpt2")
    assert model.lm_head.weight is model.wte.weight
    assert sum(1 for _ in model.parameters()) == sum(1 for _ in model.named_parameters(remove_duplicate=False)) - 1


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_torch_scaled_dot_product(causal):
    torch.manual_seed(1)
    attention = MultiHeadAttention(16, 4, dropout=0.0, causal=causal)
    x = torch.randn(2, 5, 16)
    q, k, v = (attention._split(layer(x)) for layer in (attention.query, attention.key, attention.value))
    expected = attention.output(F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attention(x), expected)


def test_unrolled_lstm_equals_torch_lstm():
    torch.manual_seed(1)
    unrolled = StackedLSTM(6, 8, layers=2)
    reference = torch.nn.LSTM(6, 8, num_layers=2, batch_first=True)
    for i, layer in enumerate(unrolled.layers):
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, f"{kind}_l{i}").data.copy_(getattr(layer.cell, kind))
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(unrolled(x), reference(x)[0])


def test_resnet_depth_option():
    assert _parameters(_meta("resnet50", depth=101)[0]) == PUBLISHED_PARAMETERS["resnet101"]


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("resnet50", {"depht": 50}, "no size option 'depht'"),
        ("resnet50", {"depth": 51}, "depth must be one of"),
        ("vgg19", {"width": 0}, "positive integer"),
        ("alexnet", {"dropout": 1.0}, r"\[0, 1\)"),
        ("inception_v3", {"aux": 1}, "true or false"),
        ("inception_v3", {"image_size": 160}, "aux=false"),
    ],
)
def test_bad_size_options_are_named(name, options, message):
    with pytest.raises(OptionError, match=message):
        ZOO[name].factory(2, **options)


@pytest.mark.parametrize("batch", [0, -1, 2.0, True])
def test_bad_batch_size(batch):
    with pytest.raises(OptionError, match="batch size"):
        ZOO["lenet"].factory(batch)


def test_size_options_are_the_factory_defaults():
    for entry in ZOO.values():
        assert set(entry.tiny) <= set(entry.size_options)
        assert all(not isinstance(v, (list, tuple, dict)) for v in entry.size_options.values())
    assert ZOO["inception_v3"].size_options["image_size"] == 299
