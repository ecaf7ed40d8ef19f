"""A kept sequence (labkit.sequence, `lab.prefill`): continued on the reference it equals the one-shot
pass's later rows to 1e-12, the first token after the prefix included (the boundary engines get
wrong); on the GPU it passes against the reference's continuation; a fork continues alike and leaves
its source as it was; a verifier's pass equals its decode steps; and a state this lab cannot continue
is refused before any work."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.errors import InvalidArgumentError, PromptTooLongError
from labkit.sequence import path_name

IDS = [(7 * i + 3) % 200 + 1 for i in range(19)]
PREFIX = 5


@pytest.fixture(scope="module", params=["gemma3", "tiny-granitehybrid"])
def lab(request, tiny_model):
    """A sliding window (tiny gemma3's is 4) and a hybrid's recurrent state."""
    return labkit.open(tiny_model("gemma3", "Q8_0") if request.param == "gemma3" else request.param)


def later_rows(one: labkit.Run, name: str, start: int) -> np.ndarray:
    """The one-shot pass's capture from position `start` on (query rows of an attention map)."""
    a = np.asarray(one[name], np.float64)
    return a[:, start:] if a.ndim == 3 and name.endswith(("attn_scores", "attn_probs")) else a[start:]


def test_a_reference_prefix_continued_equals_the_one_shot_pass(lab):
    one = lab.reference(IDS)
    state = lab.prefill(IDS[:PREFIX], engine="reference")
    assert state.n_past == PREFIX and state.engine == "reference"
    rest = lab.reference(IDS[PREFIX:], state=state)
    assert rest.n_past == PREFIX and rest.path == f"prefix={PREFIX}" and state.n_past == len(IDS)
    for name in one.captures:
        want, got = later_rows(one, name, PREFIX), np.asarray(rest[name], np.float64)
        if name.endswith("_state"):
            want = np.asarray(one[name], np.float64)  # the state after the whole sequence
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), name
        scale = max(float(np.abs(want[finite]).max()), 1e-300) if finite.any() else 1.0
        assert float(np.abs(got[finite] - want[finite]).max(initial=0.0)) <= 1e-12 * scale, name


def test_a_gpu_prefix_continued_passes_at_the_boundary_token(lab):
    ref = lab.reference(IDS[PREFIX:], state=lab.prefill(IDS[:PREFIX], engine="reference"))
    gpu = lab.run(IDS[PREFIX:], state=lab.prefill(IDS[:PREFIX]))
    cmp = labkit.compare(gpu, ref)
    assert cmp.first_divergence is None, cmp.headline()
    assert gpu.n_past == PREFIX and gpu.path == f"prefix={PREFIX}"
    # the boundary: the first token after the prefix reads the prefix's keys (or state) as the one-shot pass does
    want = np.asarray(lab.reference(IDS, names=["logits"])["logits"][PREFIX], np.float64)
    got = np.asarray(gpu["logits"][0], np.float64)
    assert np.sum((got - want) ** 2) / np.sum(want**2) < 1e-8


def test_a_fork_continues_alike_and_leaves_its_source(lab):
    state = lab.prefill(IDS[:PREFIX])
    kept = state.fork()
    first = lab.run(IDS[PREFIX:], state=state, names=["logits"])
    again = lab.run(IDS[PREFIX:], state=kept, names=["logits"])
    assert np.array_equal(first["logits"], again["logits"])  # the same cache, copied bit for bit
    assert state.n_past == kept.n_past == len(IDS) and state.cached == kept.cached == len(IDS)
    # its own buffers: continuing the source advanced the source's recurrent states in place, and the
    # fork still continued from the prefix's (a shared state would have started from the source's end)
    assert all(a is not b for a, b in zip(state.held.kv.k, kept.held.kv.k, strict=True) if a is not None)
    assert all(state.held.kv.states[key] is not kept.held.kv.states[key] for key in state.held.kv.states)
    ref_state = lab.prefill(IDS[:PREFIX], engine="reference")
    ref_kept = ref_state.fork()
    lab.reference(IDS[PREFIX:], state=ref_state, names=["logits"])
    assert ref_kept.n_past == PREFIX and ref_kept.held.n_past == PREFIX


def test_a_verifier_pass_equals_its_decode_steps(lab):
    base = lab.prefill(IDS[:15])
    verified = lab.verify(IDS[15:], state=base)
    assert verified.path == "verify=4" and base.n_past == base.cached == 15  # left for the next draft
    steps = lab.run(IDS[15:], ubatch=1, state=base.fork())
    cmp = labkit.compare(verified, steps)
    assert cmp.first_divergence is None, cmp.headline()
    ref = lab.verify(IDS[15:], state=lab.prefill(IDS[:15], engine="reference"))
    assert labkit.compare(verified, ref).first_divergence is None


def test_a_state_this_lab_cannot_continue_is_refused(lab, tiny_model):
    ref_state = lab.prefill(IDS[:PREFIX], engine="reference")
    with pytest.raises(InvalidArgumentError, match="reference engine's cache"):
        lab.run(IDS[PREFIX:], state=ref_state)
    other = labkit.open(tiny_model("llama", "Q8_0"))
    with pytest.raises(InvalidArgumentError, match="sequence; the lab is"):
        other.reference(IDS[PREFIX:], state=ref_state)
    gpu_state = lab.prefill(IDS[:PREFIX], room=3)
    with pytest.raises(PromptTooLongError, match="do not fit"):
        lab.run(IDS[PREFIX:], state=gpu_state)
    with pytest.raises(InvalidArgumentError, match="lab.prefill"):
        lab.run(IDS, state={"n_past": 5})
    with pytest.raises(InvalidArgumentError, match="prefill engine"):
        lab.prefill(IDS[:PREFIX], engine="llamacpp")
    assert gpu_state.n_past == PREFIX  # refused before any work


def test_a_state_made_under_other_kernels_is_refused(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    state = lab.prefill(IDS[:PREFIX])
    lab.use("rope", "normal_pairs")
    try:
        with pytest.raises(InvalidArgumentError, match="computed under the kernels"):
            lab.run(IDS[PREFIX:], state=state)
    finally:
        lab.use("rope", "default")
    assert lab.run(IDS[PREFIX:], state=state).n_past == PREFIX


def test_path_names():
    assert path_name(0, None, 9) == "one-shot" and path_name(0, 16, 9) == "one-shot"
    assert path_name(5, None, 9) == "prefix=5" and path_name(5, 2, 9) == "prefix=5,ubatch=2"
    assert path_name(15, None, 4, verify=True) == "verify=4"


def test_a_continuation_that_fails_midway_leaves_a_state_that_says_so(lab, monkeypatch):
    """A pass that raises after others wrote the cache (a Ctrl-C too): the state is refused after,
    not continued from a part-written cache."""
    state = lab.prefill(IDS[:PREFIX])
    real, calls = lab.executor.run_pass, []

    def second_fails(request, held):
        calls.append(len(request.ids))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(request, held)

    monkeypatch.setattr(lab.executor, "run_pass", second_fails)
    with pytest.raises(KeyboardInterrupt):
        lab.run(IDS[PREFIX:], state=state, ubatch=4)
    monkeypatch.undo()
    assert "failed midway" in state.broken and state.n_past == PREFIX
    with pytest.raises(InvalidArgumentError, match="cannot be continued"):
        lab.run(IDS[PREFIX:], state=state)
    with pytest.raises(InvalidArgumentError, match="cannot be forked"):
        state.fork()


def test_one_pass_options_are_refused_on_a_path(lab):
    state = lab.prefill(IDS[:PREFIX])
    with pytest.raises(InvalidArgumentError, match="patch= and stepped="):
        lab.run(IDS[PREFIX:], state=state, stepped=True)
    with pytest.raises(InvalidArgumentError, match="route_as="):
        lab.reference(IDS, ubatch=4, route_as=lab.reference(IDS))
    with pytest.raises(InvalidArgumentError, match="needs the state"):
        lab.verify(IDS[:3], state=None)
    assert state.n_past == state.cached == PREFIX
