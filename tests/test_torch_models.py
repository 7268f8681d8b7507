"""The validator's PyTorch models: parameter counts equal to the workload builders' (every GPT/Llama preset, counted
on the meta device, against both the closed form and the op graph), and rematerialization that changes what is
stored, never the math (the gradients of none, selective and full agree). Skipped without torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from plansim.errors import PlansimError  # noqa: E402
from plansim.profiling.torch_models import REMAT_POLICIES, build_model, num_parameters  # noqa: E402
from plansim.workload import ModelSpec, list_models, load_model  # noqa: E402
from plansim.workload.build import build_graph  # noqa: E402

TRANSFORMERS = [m["name"] for m in list_models() if m["family"] in ("gpt", "llama")]


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_parameters_equal_the_workload_builder(name: str) -> None:
    spec = load_model(name)
    model = build_model(spec, device="meta")
    graph_params = sum(op["params"] for _, op in build_graph(spec, micro_batch=1).nodes(data=True))
    assert num_parameters(model) == spec.num_parameters() == graph_params


@pytest.mark.parametrize("family,tied", [("gpt", False), ("llama", True)])
def test_parameters_follow_tied_embeddings(family: str, tied: bool) -> None:
    spec = ModelSpec(
        name="tiny", family=family, layers=2, hidden=64, heads=4, kv_heads=2 if family == "llama" else 4,
        ffn_hidden=96 if family == "llama" else 256, seq_len=16, vocab=100, tied_embeddings=tied,
    )  # fmt: skip
    assert num_parameters(build_model(spec, device="meta")) == spec.num_parameters()


def _grads(spec: ModelSpec, remat: str) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = build_model(spec, remat)
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len))
    logits = model(tokens)
    assert logits.shape == (2, spec.seq_len, spec.vocab)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, spec.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_remat_changes_storage_not_gradients(family: str) -> None:
    spec = ModelSpec(
        name="tiny", family=family, layers=2, hidden=32, heads=4, kv_heads=2 if family == "llama" else 4,
        ffn_hidden=48 if family == "llama" else 128, seq_len=8, vocab=50,
    )  # fmt: skip
    loss, grads = _grads(spec, "none")
    for remat in REMAT_POLICIES[1:]:
        other_loss, other = _grads(spec, remat)
        assert other_loss == pytest.approx(loss, rel=1e-6)
        for a, b in zip(grads, other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_only_transformers_and_known_policies() -> None:
    with pytest.raises(PlansimError, match="gpt and llama only"):
        build_model(load_model("mlp-small"), device="meta")
    with pytest.raises(PlansimError, match="remat 'sqrt'"):
        build_model(load_model("gpt3-125m"), "sqrt", device="meta")


def test_remat_stores_less() -> None:
    """Bytes autograd saves in the forward (saved-tensor hooks; weights included): selective keeps less than none
    (not the attention core's scores), full less still (only each block's input)."""
    spec = ModelSpec(name="tiny", family="gpt", layers=2, hidden=32, heads=4, seq_len=32, vocab=50)
    saved = {}
    for remat in REMAT_POLICIES:
        torch.manual_seed(0)
        model, tokens = build_model(spec, remat), torch.randint(0, spec.vocab, (2, spec.seq_len))
        total = [0]

        def pack(t: torch.Tensor, total: list[int] = total) -> torch.Tensor:
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens)
        saved[remat] = total[0]
    assert saved["none"] > saved["selective"] > saved["full"]
