"""d2lmini.copy_parameters: how a chapter checks the reader's part against d2lmini's."""

import pytest
import torch
from torch import nn

import d2lmini


class Reader(nn.Module):  # a reader's FFN, with names of its own
    def __init__(self, d, bias=True):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias)

    def forward(self, X):
        return self.down(torch.relu(self.up(X)))


def test_copied_weights_give_the_same_function():
    ref = d2lmini.FeedForward(8, act="relu", bias=True)
    mine = d2lmini.copy_parameters(ref, Reader(8), {"W_1": "up", "W_2": "down"})
    X = torch.randn(2, 3, 8)
    torch.testing.assert_close(mine(X), ref(X))
    assert all(not p.is_meta for p in mine.parameters())


def test_longest_prefix_wins_and_source_is_untouched():
    ref = d2lmini.FeedForward(4, act="relu", bias=True)
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    mine = d2lmini.copy_parameters(ref, Reader(4), {"W_1": "up", "W_2": "down", "W_2.weight": "down.weight"})
    torch.testing.assert_close(mine.down.weight, ref.W_2.weight)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_mismatches_are_named():
    ref = d2lmini.FeedForward(8, act="relu", bias=False)
    with pytest.raises(ValueError, match="up.bias"):
        d2lmini.copy_parameters(ref, Reader(8), {"W_1": "up", "W_2": "down"})
    with pytest.raises(ValueError, match="shapes differ"):
        d2lmini.copy_parameters(d2lmini.FeedForward(8, act="relu", bias=True), Reader(6), {"W_1": "up", "W_2": "down"})
    with pytest.raises(TypeError, match="rename"):
        d2lmini.copy_parameters(ref, Reader(8, bias=False), {"W_1": 3})
    with pytest.raises(TypeError, match="target"):
        d2lmini.copy_parameters(ref, "module")


def test_a_weight_written_as_a_plain_tensor_is_named():
    class PlainNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.gamma, self.beta = torch.ones(d), torch.zeros(d)  # not nn.Parameter

    with pytest.raises(ValueError, match=r"\['beta', 'gamma'\] are plain tensors: make them nn.Parameter"):
        d2lmini.copy_parameters(nn.LayerNorm(4), PlainNorm(4), {"weight": "gamma", "bias": "beta"})


def test_a_buffer_written_as_a_plain_tensor_is_told_to_be_a_buffer():
    class Source(nn.Module):  # a weight and a buffer, as a mixture of experts' router and expert_bias
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))
            self.register_buffer("expert_bias", torch.zeros(4))

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.expert_bias = torch.ones(4), torch.zeros(4)  # neither registered

    with pytest.raises(ValueError) as error:
        d2lmini.copy_parameters(Source(), Plain())
    message = str(error.value)
    assert "['weight'] are plain tensors: make them nn.Parameter" in message, message
    assert "['expert_bias'] are plain tensors: register them with self.register_buffer" in message, message


def test_one_module_under_two_names_is_refused_unless_the_source_ties_them_too():
    class Two(nn.Module):
        def __init__(self, shared=False):
            super().__init__()
            self.norm1 = nn.LayerNorm(4)
            self.norm2 = self.norm1 if shared else nn.LayerNorm(4)

    with pytest.raises(ValueError, match=r"\['norm1.weight', 'norm2.weight'\] are one tensor"):
        d2lmini.copy_parameters(Two(), Two(shared=True))
    tied = d2lmini.copy_parameters(Two(shared=True), Two(shared=True))  # tied in both: nothing lost
    assert tied.norm1 is tied.norm2


def test_a_transient_buffer_and_a_plain_list_of_modules_are_named():
    class Source(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
            self.register_buffer("expert_bias", torch.zeros(2))

    class Reader(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = [nn.Linear(2, 2) for _ in range(2)]  # a plain list: not registered
            self.register_buffer("expert_bias", torch.zeros(2), persistent=False)

    with pytest.raises(ValueError) as error:
        d2lmini.copy_parameters(Source(), Reader())
    message = str(error.value)
    assert "['expert_bias'] are buffers registered with persistent=False" in message, message
    assert "['experts'] are plain Python lists" in message and "nn.ModuleList" in message, message


def test_a_buffer_only_the_target_holds_keeps_its_value():
    class Masked(nn.Linear):  # a linear layer with a causal mask of its own, as nanoGPT keeps one
        def __init__(self):
            super().__init__(4, 4)
            self.register_buffer("future", torch.ones(3, 3, dtype=torch.bool).triu(1))

    source = nn.Linear(4, 4)
    target = d2lmini.copy_parameters(source, Masked())
    assert torch.equal(target.weight, source.weight) and torch.equal(target.future, torch.ones(3, 3).triu(1).bool())
