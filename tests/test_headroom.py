"""Memory headroom: the CUDA context, NCCL's buffers, the caching allocator's rounding, the thin-margin warning, and
the loss's logits transient; checked against hand computations from NCCL's and PyTorch's sources and against the
other engine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import plansim
from plansim.costs.allocator import reserved_bytes
from plansim.costs.nccl_groups import connected_algorithms
from plansim.costs.nccl_memory import (
    CHANNEL_DEVICE_BYTES,
    COMM_DEVICE_BYTES,
    LL128_BUFFSIZE,
    LL_BUFFSIZE,
    NET_PAIR_BYTES,
    NVLS_BUFFSIZE,
    P2P_PAIR_BYTES,
    SIMPLE_BUFFSIZE,
    Communicator,
    NcclChannels,
    communicator_bytes,
    communicator_channels,
)
from plansim.hardware import load_hardware
from plansim.step.result import THIN_MARGIN
from plansim.workload import build_graph, graph_totals, load_model

MiB = 2**20


def test_buffer_sizes_are_nccls_defaults() -> None:
    # NCCL's docs: NCCL_BUFFSIZE defaults to 4 MiB; LL lines of 16 B, 8 per thread, 512 threads, 8 steps; LL128
    # 120 uint64 per thread, 640 threads, 8 steps; NVLS "buffSize 1048576" as NCCL's init log prints it
    assert (4 * MiB, 512 * 1024, 4_915_200) == (SIMPLE_BUFFSIZE, LL_BUFFSIZE, LL128_BUFFSIZE)
    assert NVLS_BUFFSIZE == 1_048_576
    # each end one cuMem allocation rounded to 2 MiB (nccl 5067397c src/include/comm.h:46, alloc.h:317-318):
    # NVLink receive end 4 KiB + 512 KiB + 4,915,200 + 4 MiB = 9,637,888 -> 10 MiB, send end 4 KiB -> 2 MiB (the
    # 10,485,760- and 2,097,152-byte allocations of NVIDIA/nccl issue #1685); network send LL128 + Simple
    # 9,109,504 -> 10 MiB, receive all three 9,633,792 -> 10 MiB
    assert (10 * MiB + 2 * MiB, 10 * MiB + 10 * MiB) == (P2P_PAIR_BYTES, NET_PAIR_BYTES)
    # per channel three device arrays (src/channel.cc:44-48, 60), per communicator two (src/init.cc:587-590)
    assert (6 * MiB, 4 * MiB) == (CHANNEL_DEVICE_BYTES, COMM_DEVICE_BYTES)


A100 = NcclChannels(coll=24, p2p_per_peer=32, nvls=0, net_p2p_per_peer=2, gpus_per_node=8)
H100 = NcclChannels(coll=24, p2p_per_peer=32, nvls=16, net_p2p_per_peer=2, gpus_per_node=8)


def test_a_tp_group_inside_a_dgx_a100_holds_its_ring_and_channels() -> None:
    # (a) tp=8 inside one DGX A100: its calls run the ring only (the step model's pick at every size from 4 B to
    # 4 GiB); 24 collective channels, 32 set up (p2pnChannels: 24 rounded up to a power of two, paths.cc:984-990,
    # 1007), each 3 x 2 MiB; the device communicator 2 x 2 MiB; per channel a send end (2 MiB) and a receive end
    # holding LL, LL128 and Simple (10 MiB) whatever protocols the calls use
    cluster = load_hardware("dgx-a100", gpus=8)
    for calls in (("all_reduce",), ("all_gather", "reduce_scatter")):
        assert connected_algorithms(cluster, calls, 8, 1) == ("ring",)
    tp = Communicator("tp", 8, 8, algorithms=("ring",))
    assert communicator_bytes(tp, A100) == 32 * 6 * MiB + 4 * MiB + 24 * (2 + 10) * MiB  # 484 MiB
    assert communicator_bytes(Communicator("dp", 1, 1), A100) == 0
    # on a DGX H100 an all-reduce group in the node runs NVLS too: 16 NVLS channels' arrays (2 MiB each, channel.cc:98)
    # and its buffer, 16 channels x 2 x 1 MiB per head, 8 heads (nvls.cc:426-430)
    h = load_hardware("dgx-h100", gpus=8)
    assert connected_algorithms(h, ("all_reduce",), 8, 1) == ("nvls", "ring")
    nvls_tp = Communicator("tp", 8, 8, algorithms=("nvls", "ring"))
    assert communicator_bytes(nvls_tp, H100) == 32 * 6 * MiB + 16 * 2 * MiB + 4 * MiB + 24 * 12 * MiB + 256 * MiB


def test_a_dp_group_across_nodes_holds_the_ring_and_tree_of_its_channels() -> None:
    # (b) dp=16 with tp=8, one rank per DGX A100 node: NCCL's search over one GPU and its NIC finds 24 x 1/8 = 3
    # channels (as nccl_groups prices the group), 4 set up; every end on the network, 10 MiB each (net.cc:916-918,
    # 945; 1101, 1124-1127); the all-reduce runs ring and tree, PAT never (all-reduce), and a reduce-scatter group
    # runs the ring alone (PAT is never the pick at these sizes)
    cluster = load_hardware("dgx-a100", gpus=128)
    assert connected_algorithms(cluster, ("all_reduce",), 16, 16) == ("ring", "tree")
    assert connected_algorithms(cluster, ("all_gather", "reduce_scatter"), 16, 16) == ("ring",)
    dp = Communicator("dp", 16, 1, algorithms=("ring", "tree"))
    assert communicator_channels(dp, A100) == 3
    init = 4 * 6 * MiB + 4 * MiB
    ring = 3 * 20 * MiB  # a send end to the successor and a receive end from the predecessor per channel
    tree = 3 * 2 * 20 * MiB  # (3 edges as an inner node of one tree + 1 as a leaf of the other) / 2, both ways
    assert communicator_bytes(dp, A100) == init + ring + tree  # 208 MiB
    assert communicator_bytes(Communicator("dp", 16, 1, algorithms=("ring",)), A100) == init + ring
    # PAT, where a group ran it: the ranks 1, 2, 4, 8 ahead and behind, 7 distinct, each edge both ways
    assert communicator_bytes(Communicator("dp", 16, 1, algorithms=("pat",)), A100) == init + 3 * 7 * 20 * MiB
    # a whole node's GPUs per node (dp=64 over 8 nodes): 24 channels; each rank a node's boundary on 1/8 of them
    wide = Communicator("dp", 64, 8, algorithms=("ring",))
    assert communicator_bytes(wide, A100) == 32 * 6 * MiB + 4 * MiB + 24 * (20 * MiB // 8 + 7 * 12 * MiB // 8)


def test_a_pipeline_peer_holds_its_p2p_buffers() -> None:
    # (c) a pipeline neighbour on another node: a 2-rank communicator of 3 channels, 4 set up; its sends and
    # receives use the two shared pools, 4 p2p channels x 16 steps x 128 KiB each (net.cc:646, 663-666), not
    # per-connection buffers
    net = Communicator("pp", 2, 1, algorithms=(), p2p=True)
    assert communicator_bytes(net, A100) == 4 * 6 * MiB + 4 * MiB + 2 * (4 * 16 * 128 * 1024)  # 44 MiB
    # in the node: 32 p2p channels per peer (paths.cc:933-936: 2 x 240/20 = 24, rounded up to 32), a send and a
    # receive end on each (the neighbour receives from and sends to this rank)
    local = Communicator("pp", 2, 2, algorithms=(), p2p=True)
    assert communicator_bytes(local, A100) == 32 * 6 * MiB + 4 * MiB + 32 * 12 * MiB


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
    # dp=2 with zero=1 (reduce-scatter and all-gather: ring only) two ranks in one node, pp=2 across nodes, tied
    # embeddings
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    r = plansim.simulate(
        model, cluster, "dp=2,tp=4,pp=2,micro_batch=1,global_batch=8,zero=1,sequence_parallel=true", engine="analytic"
    )
    in_node = 32 * 6 * MiB + 4 * MiB + 24 * 12 * MiB  # 32 channels' arrays, the device communicator, the ring
    net_peer = 4 * 6 * MiB + 4 * MiB + 2 * 4 * 2 * MiB  # 3 channels (24 x 1/8), 4 set up, two shared pools
    embedding = 4 * 6 * MiB + 4 * MiB + 3 * 20 * MiB  # a 2-rank all-reduce across nodes: the ring alone
    assert connected_algorithms(cluster, ("all_reduce",), 2, 2) == ("ring",)
    assert r.memory_breakdown_bytes["nccl"] == in_node + in_node + net_peer + embedding


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
