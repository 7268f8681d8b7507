"""Memory headroom: the CUDA context, NCCL's buffers, the caching allocator's rounding, the thin-margin warning, and
the loss's logits transient; checked against hand computations from NCCL's and PyTorch's sources and against the
other engine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import plansim
from plansim.costs.allocator import reserved_bytes
from plansim.costs.nccl_memory import (
    CONNECTION_SET_BYTES,
    LL128_BUFFSIZE,
    LL_BUFFSIZE,
    NVLS_BUFFSIZE,
    SIMPLE_BUFFSIZE,
    Communicator,
    NcclChannels,
    communicator_bytes,
)
from plansim.hardware import load_hardware
from plansim.step.result import THIN_MARGIN
from plansim.workload import build_graph, graph_totals, load_model

MiB = 2**20


def test_buffer_sizes_are_nccls_defaults() -> None:
    # NCCL's docs: NCCL_BUFFSIZE defaults to 4 MiB; LL lines of 16 B, 8 per thread, 512 threads, 8 steps; LL128
    # 120 uint64 per thread, 640 threads, 8 steps; NVLS "buffSize 1048576" as NCCL's init log prints it
    assert (4 * MiB, 512 * 1024, 4_915_200) == (SIMPLE_BUFFSIZE, LL_BUFFSIZE, LL128_BUFFSIZE)
    assert CONNECTION_SET_BYTES == 9_633_792 and NVLS_BUFFSIZE == 1_048_576


def test_communicator_bytes_by_hand() -> None:
    ch = NcclChannels(coll=24, p2p_per_peer=32, nvls=16, net_p2p_per_peer=2)
    assert communicator_bytes(Communicator("dp", 1, 1), ch) == 0
    # a ring inside one NVSwitch node with NVLS: 24 sets, plus 16 channels x 2 x 1 MiB per head, 8 heads
    assert communicator_bytes(Communicator("tp", 8, 8, all_reduce=True), ch) == 24 * 9_633_792 + 256 * MiB
    # an all-reduce across nodes adds the tree: 3 sets per channel (NCCL's two trees, averaged)
    assert communicator_bytes(Communicator("dp", 64, 2, all_reduce=True), ch) == 24 * 4 * 9_633_792
    assert communicator_bytes(Communicator("dp", 64, 2), ch) == 24 * 9_633_792  # reduce-scatter: the ring only
    assert communicator_bytes(Communicator("pp", 2, 2, p2p=True), ch) == 32 * 9_633_792
    assert communicator_bytes(Communicator("pp", 2, 1, p2p=True), ch) == 2 * 2 * MiB


@given(st.integers(0, 2**34))
def test_allocator_rounding_is_the_cachings_block_rule(n: int) -> None:
    r = reserved_bytes(n)
    assert r >= n and r % 512 == 0 and r - n < 2 * MiB
    if n > 10 * MiB:
        assert r % (2 * MiB) == 0 and r - n < 2 * MiB
    else:
        assert r - n < 512


@pytest.mark.parametrize("remat", ["none", "selective", "full"])
def test_engines_agree_on_the_fixed_costs(remat: str) -> None:
    # micro-batch 5: 2048 x 5 x 768 x 2 B = 15 MiB tensors, which the allocator rounds to 16 MiB segments
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-h100", gpus=8)
    text = f"dp=2,tp=2,pp=2,micro_batch=5,global_batch=20,remat={remat}"
    a = plansim.simulate(model, cluster, text, engine="analytic")
    d = plansim.simulate(model, cluster, text, engine="des")
    ma, md = a.memory_breakdown_bytes, d.memory_breakdown_bytes
    assert ma["cuda_context"] == md["cuda_context"] == cluster.gpu.cuda_context_bytes
    assert ma["nccl"] == md["nccl"] > 0
    # the same rounding ratio of the activations at the peak (full remat's last stage: the engines' activations
    # differ there already, plansim.costs.nccl_memory)
    assert ma["fragmentation"] / ma["activations"] == pytest.approx(md["fragmentation"] / md["activations"], rel=1e-6)
    assert 0 < ma["fragmentation"] < 0.05 * ma["activations"]


def test_nccl_buffers_by_hand_for_a_megatron_layout() -> None:
    # dgx-a100 (24 coll channels, 32 p2p channels per peer, no NVLS), tp=4 sequence parallel inside a node,
    # dp=2 with zero=1 (reduce-scatter: ring only) two ranks in one node, pp=2 across nodes, tied embeddings
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    r = plansim.simulate(
        model, cluster, "dp=2,tp=4,pp=2,micro_batch=1,global_batch=8,zero=1,sequence_parallel=true", engine="analytic"
    )
    ring = 24 * CONNECTION_SET_BYTES
    net_peer = 2 * 2 * MiB  # 2 channels per network peer (one 25 GB/s NIC: ceil(25/14)), send and receive ends
    embedding = ring + round(24 * 3 * CONNECTION_SET_BYTES)  # a 2-rank all-reduce group across nodes, tree included
    assert r.memory_breakdown_bytes["nccl"] == ring + ring + net_peer + embedding


def test_a_thin_margin_is_reported_and_a_wide_one_is_not() -> None:
    model = load_model("gpt3-1.3b")
    wide = plansim.simulate(model, load_hardware("dgx-a100", gpus=8), "dp=8,micro_batch=1,global_batch=8")
    assert wide.fits and wide.memory_margin > THIN_MARGIN and wide.warnings == []
    capacity = load_hardware("dgx-a100", gpus=8).gpu.memory_bytes
    # micro-batches until the peak is within 5% of capacity, but fits
    for mb in range(1, 64):
        r = plansim.simulate(model, load_hardware("dgx-a100", gpus=8), f"dp=8,micro_batch={mb},global_batch={8 * mb}")
        if not r.fits:
            break
        last = r
    assert last.fits
    margin = (capacity - last.peak_memory_bytes) / capacity
    assert last.memory_margin == pytest.approx(margin)
    assert (last.warnings != []) == (margin < THIN_MARGIN)


def test_the_logits_transient_is_beside_the_stored_activations_not_the_working_set() -> None:
    # one GPU, micro-batch 2: the bf16 logits (2 bytes x b x s x V) live beside everything stored while the loss
    # runs; under full remat, beside the stored layer inputs but never beside a rebuilt block (backward's)
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=1)
    graph = build_graph(model, 2)
    logits = 2 * 2 * model.seq_len * model.vocab
    saved = graph_totals(graph)["saved_bytes"]
    for engine in ("analytic", "des"):
        none = plansim.simulate(model, cluster, "micro_batch=2,global_batch=2,remat=none", engine=engine)
        assert none.memory_breakdown_bytes["activations"] == pytest.approx(saved + logits, rel=1e-9)
    block = sum(a["saved_bytes"] for _, a in graph.nodes(data=True) if a["layer"] == 0)
    ends = sum(a["saved_bytes"] for _, a in graph.nodes(data=True) if not 0 <= a["layer"] < model.layers)
    inputs = model.layers * graph.graph["layer_input_bytes"]
    full = plansim.simulate(model, cluster, "micro_batch=2,global_batch=2,remat=full", engine="analytic")
    assert full.memory_breakdown_bytes["activations"] == pytest.approx(inputs + ends + max(block, logits), rel=1e-9)
