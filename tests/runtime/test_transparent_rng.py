"""The RNG states the transparent mode publishes each step for a replacement: the exact
states come back from their encoding, and anything else read from the store is refused
(it is not trusted to hand back code or a state of the wrong shape)."""

from __future__ import annotations

import base64
import json
import random

import pytest
import torch

from runtime.transparent.worker import _decode_rng, _encode_rng, _rng_states, _same_rng


def test_the_states_come_back_exactly() -> None:
    random.seed(7)
    torch.manual_seed(7)
    random.random()
    random.gauss(0.0, 1.0)  # a cached Gaussian is part of the state
    torch.rand(3)
    states = _rng_states()
    boundary, back = _decode_rng(_encode_rng(12, states).encode())
    assert boundary == 12 and _same_rng(states, back)
    random.setstate(back["random"])
    torch.set_rng_state(back["torch"])
    drawn, tensor = random.random(), torch.rand(2)
    random.setstate(states["random"])
    torch.set_rng_state(states["torch"])
    assert random.random() == drawn and torch.equal(torch.rand(2), tensor)


@pytest.mark.parametrize("change", ["short", "not_base64", "missing", "pickle"])
def test_a_malformed_state_is_refused(change: str) -> None:
    data = json.loads(_encode_rng(3, _rng_states()))
    if change == "short":
        data["random"][1] = base64.b64encode(b"\0" * 8).decode()
    elif change == "not_base64":
        data["torch"] = "%%%"
    elif change == "missing":
        del data["random"]
    else:
        data = {"boundary": 3, "torch": "gASVAAAAAAAAAAA=", "random": "cos\nsystem\n"}
    with pytest.raises(ValueError, match="malformed RNG state"):
        _decode_rng(json.dumps(data).encode())
