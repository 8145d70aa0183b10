"""The shared argument checks (d2lmini/_checks.py): a wrong kind of value raises TypeError,
a wrong value ValueError, and the message names the argument."""

from __future__ import annotations

import pytest
import torch

import d2lmini
from d2lmini import _checks
from d2lmini.chapters import ch05_rmsnorm
from d2lmini.data import CharCorpus
from d2lmini.timing import time_norms


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: _checks.check_nonnegative_int("warmup", 1.5), TypeError, "warmup must be an int"),
    (lambda: _checks.check_nonnegative_int("warmup", -1), ValueError, "warmup must be >= 0"),
    (lambda: _checks.check_int_at_least("num_steps", 1, 2, "tokens"), ValueError, r"num_steps must be >= 2 \(tokens\)"),
    (lambda: _checks.check_int_in("k", 5, 1, 4), ValueError, r"k must be in \[1, 4\]"),
    (lambda: _checks.check_int_in("k", True, 1, 4), TypeError, "k must be an int"),
    (lambda: _checks.check_int_sequence("depths", 8), TypeError, "depths must be a sequence"),
    (lambda: _checks.check_int_sequence("depths", ()), ValueError, "at least one"),
    (lambda: _checks.check_int_sequence("depths", (1, 0)), ValueError, r"depths\[1\] must be >= 1"),
    (lambda: _checks.check_int_sequence("depths", (2, 2), increasing=True), ValueError, "increasing"),
    (lambda: _checks.check_seeds((0, 0)), ValueError, "seeds must be distinct"),
    (lambda: _checks.check_positive_floats("scales", "1.0"), TypeError, "scales"),
    (lambda: _checks.check_finite_float("offset", "1"), TypeError, "offset must be a number"),
    (lambda: _checks.check_finite_float("offset", float("inf")), ValueError, "offset must be a finite"),
    (lambda: _checks.check_float_tensor("X", torch.ones(3, dtype=torch.long)), TypeError, "floating"),
    (lambda: _checks.check_float_tensor("X", torch.ones(3), min_dim=2), ValueError, "at least 2 dimensions"),
    (lambda: _checks.check_last_dim("X", [1.0], 4), TypeError, "X must be a torch.Tensor"),
    (lambda: _checks.check_last_dim("X", torch.ones(2, 3), 4), ValueError, "last dimension 4"),
    (lambda: _checks.check_vector("weight", [1.0], 3), TypeError, "weight"),
    (lambda: _checks.check_vector("weight", torch.ones(4), 3), ValueError, r"shape \(3,\)"),
    (lambda: _checks.check_dtype_name("dtypes", 16, {"float16": torch.float16}), TypeError, "dtypes"),
    (lambda: _checks.check_float_dtype("dtype", torch.float16, (torch.float32,)), TypeError, "dtype"),
    (lambda: _checks.check_pair("configs[0]", "pre"), TypeError, "pair"),
])
def test_shared_checks(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


@pytest.mark.parametrize("call, error", [  # each raised the other kind before the checks were shared
    (lambda: time_norms(warmup=1.5, fresh_process=False), TypeError),
    (lambda: time_norms(shape=1024, fresh_process=False), TypeError),
    (lambda: CharCorpus.from_text(b"x" * 2000), TypeError),
    (lambda: d2lmini.MixtureOfExperts(16, num_shared_experts=1.0), TypeError),
    (lambda: d2lmini.RMSNorm(8)([1.0] * 8), TypeError),
    (lambda: ch05_rmsnorm.compare_with_layernorm(offset="1"), TypeError),
    (lambda: ch05_rmsnorm.rms_norm_no_upcast(torch.ones(2, 3), weight=[1.0, 1.0, 1.0]), TypeError),
    (lambda: d2lmini.depth_explorer(max_depth=4.0), TypeError),
])
def test_wrong_kinds_raise_type_error(call, error):
    with pytest.raises(error):
        call()


def test_seeded_draws_repeat_and_leave_the_global_rng_alone():
    from d2lmini.seeding import seeded

    state = torch.random.get_rng_state()
    with seeded(3):
        a = torch.randn(4)
    with seeded(3):
        b = torch.randn(4)
    assert torch.equal(a, b)
    assert torch.equal(state, torch.random.get_rng_state())
    with pytest.raises(TypeError, match="seed"):
        with seeded(1.5):
            pass
