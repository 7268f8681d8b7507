"""Hugging Face ``config.json`` import (``plansim/workload/hf_config.py``, ``load_model``, ``plansim import``).

Real configs of five families (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2) against their published parameter counts;
the same configs against a count of the tensors their transformers modules hold (independent of ``ModelSpec``);
the key mapping; one-line errors for bad input; the CLI writing a model YAML that ``simulate`` reads back.

The files in ``tests/data/hf`` reproduce the public config.json files (every key as published); the URL of each is
in ``CONFIGS``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.errors import PlansimError
from plansim.workload import ModelSpec, build_graph, graph_totals, load_model
from plansim.workload.families import hf_model_types
from plansim.workload.hf_config import from_hf_config, model_yaml, read_hf_config, unmodelled

DATA = Path(__file__).parent / "data" / "hf"
HF = "https://huggingface.co"

# file -> where the config.json was published.
CONFIGS = {
    "gpt2.json": f"{HF}/openai-community/gpt2/blob/main/config.json",
    "gpt-neox-20b.json": f"{HF}/EleutherAI/gpt-neox-20b/blob/main/config.json",
    "pythia-160m.json": f"{HF}/EleutherAI/pythia-160m/blob/main/config.json",
    "llama-2-7b.json": f"{HF}/meta-llama/Llama-2-7b-hf/blob/main/config.json",
    "mistral-7b-v0.1.json": f"{HF}/mistralai/Mistral-7B-v0.1/blob/main/config.json",
    "qwen2.5-7b.json": f"{HF}/Qwen/Qwen2.5-7B/blob/main/config.json",
    "qwen2.5-0.5b.json": f"{HF}/Qwen/Qwen2.5-0.5B/blob/main/config.json",
}

# (file, published total parameters, where it was published). Each must hold within 1%.
PUBLISHED = [
    # Model card: "This is the smallest version of GPT-2, with 124M parameters."
    ("gpt2.json", 124e6, f"{HF}/openai-community/gpt2"),
    # Model card, hyperparameter table: "Num. parameters 20,556,201,984".
    ("gpt-neox-20b.json", 20_556_201_984, f"{HF}/EleutherAI/gpt-neox-20b"),
    # Touvron et al. 2023a, "LLaMA: Open and Efficient Foundation Language Models", Table 2: 6.7B at dimension 4096,
    # 32 heads, 32 layers; Llama 2 7B keeps those shapes (Touvron et al. 2023b, sec 2.2: GQA only at 34B and 70B).
    ("llama-2-7b.json", 6.7e9, "arXiv:2302.13971 Table 2"),
    # Mistral AI, "Announcing Mistral 7B" (27 Sep 2023): "Mistral 7B is a 7.3B parameter model".
    ("mistral-7b-v0.1.json", 7.3e9, "https://mistral.ai/news/announcing-mistral-7b"),
    # Model card: "Number of Parameters: 7.61B".
    ("qwen2.5-7b.json", 7.61e9, f"{HF}/Qwen/Qwen2.5-7B"),
    # Model card: "Number of Parameters: 0.49B" (tied embeddings: "Tie Embedding: True").
    ("qwen2.5-0.5b.json", 0.49e9, f"{HF}/Qwen/Qwen2.5-0.5B"),
]

# (file, published parameters without the embedding and output matrices, tolerance, where it was published).
NON_EMBEDDING = [
    # Model card, Pythia suite table: "160M | Non-Embedding Params 85,056,000" (exact).
    ("pythia-160m.json", 85_056_000, 0.0, f"{HF}/EleutherAI/pythia-160m"),
    # Model cards: "Number of Paramaters (Non-Embedding): 6.53B" and "0.36B" (rounded: within 1%).
    ("qwen2.5-7b.json", 6.53e9, 0.01, f"{HF}/Qwen/Qwen2.5-7B"),
    ("qwen2.5-0.5b.json", 0.36e9, 0.01, f"{HF}/Qwen/Qwen2.5-0.5B"),
]

runner = CliRunner()


def config(file: str) -> dict[str, Any]:
    return json.loads((DATA / file).read_text())


def non_embedding(spec: ModelSpec) -> int:
    """Parameters less the word embedding, the untied output head and a learned position table."""
    positions = spec.seq_len * spec.hidden if spec.learned_positions else 0
    return spec.num_parameters() - spec.vocab * spec.hidden * (1 if spec.tied_embeddings else 2) - positions


def module_tensors(c: dict[str, Any]) -> int:
    """Elements of every weight and bias the transformers module of ``c["model_type"]`` holds, tensor by tensor
    (GPT2LMHeadModel, GPTNeoXForCausalLM, LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM; a tied head
    counted once): a count written from the architectures, independent of ``ModelSpec``."""
    kind = c["model_type"]
    if kind == "gpt2":
        h, f, v, p, layers = (
            c["n_embd"],
            c.get("n_inner") or 4 * c["n_embd"],
            c["vocab_size"],
            c["n_positions"],
            c["n_layer"],
        )
        block = (
            2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
        )  # ln_1 c_attn c_proj ln_2 c_fc c_proj
        return v * h + p * h + layers * block + 2 * h  # wte, wpe, blocks, ln_f; lm_head tied to wte
    h, f, v, layers = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    if kind == "gpt_neox":
        block = 2 * h + 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)  # 2 LN, qkv, dense, MLP
        return v * h + layers * block + 2 * h + v * h  # embed_in, layers, final_layer_norm, embed_out
    kv_width = kv_heads(c) * h // c["num_attention_heads"]
    block = h * h + 2 * h * kv_width + h * h + 3 * h * f + 2 * h  # q k v o, gate up down, 2 RMSNorms
    head = 0 if c.get("tie_word_embeddings", False) else v * h
    return v * h + layers * block + qkv_biases(c) + h + head  # embed_tokens, layers, Qwen2's biases, norm, lm_head


def kv_heads(c: dict[str, Any]) -> int:
    return c.get("num_key_value_heads") or c["num_attention_heads"]


def qkv_biases(c: dict[str, Any]) -> int:
    """Qwen2's biases on the Q, K and V projections (Qwen2Attention: ``bias=True`` on q_proj, k_proj, v_proj)."""
    if c["model_type"] != "qwen2":
        return 0
    h = c["hidden_size"]
    return c["num_hidden_layers"] * (h + 2 * kv_heads(c) * h // c["num_attention_heads"])


def one_line_error(call: Any, *words: str) -> str:
    with pytest.raises(PlansimError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


# --- the published figures ------------------------------------------------------------------------------------


def test_every_config_is_cited_and_five_families_are_covered() -> None:
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(CONFIGS)
    types = {"gpt2", "gpt_neox", "llama", "mistral", "qwen2"}
    moe = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"}  # their configs: tests/data/hf_moe, tests/test_moe.py
    assert {config(f)["model_type"] for f in CONFIGS} == set(hf_model_types()) - moe == types


@pytest.mark.parametrize(("file", "published", "source"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_count_matches_published(file: str, published: float, source: str) -> None:
    assert from_hf_config(DATA / file).num_parameters() == pytest.approx(published, rel=0.01), source


@pytest.mark.parametrize(("file", "published", "tolerance", "source"), NON_EMBEDDING, ids=[n[0] for n in NON_EMBEDDING])
def test_non_embedding_count_matches_published(file: str, published: float, tolerance: float, source: str) -> None:
    assert non_embedding(from_hf_config(DATA / file)) == pytest.approx(published, rel=tolerance, abs=0), source


def test_pythia_needs_rotary_positions() -> None:
    """A learned table of 2048 rows would add 1.57M parameters the checkpoint lacks, 1.8% of Pythia-160M's published
    non-embedding count: GPT-NeoX configs import with ``learned_positions: false``."""
    spec = from_hf_config(DATA / "pythia-160m.json")
    learned = spec.model_copy(update={"learned_positions": True})
    extra = learned.num_parameters() - spec.num_parameters()
    assert extra == 2048 * 768
    assert extra / 85_056_000 > 0.018


@pytest.mark.parametrize("file", sorted(CONFIGS))
def test_count_equals_the_modules_tensors_plus_what_is_not_modelled(file: str) -> None:
    """Exact, for every family: ModelSpec's count, plus the biases ``unmodelled`` reports, is the module's count."""
    c = config(file)
    spec = from_hf_config(c)
    assert spec.num_parameters() + qkv_biases(c) == module_tensors(c)
    assert graph_totals(build_graph(spec, 1))["params"] == spec.num_parameters()
    uncounted = [note.split(" (")[0] for note in unmodelled(c, spec) if "not counted" in note]
    assert uncounted == ([f"biases on Q, K and V: {qkv_biases(c):,} parameters"] if qkv_biases(c) else [])


def test_llama_2_7b_is_the_preset() -> None:
    spec = from_hf_config(DATA / "llama-2-7b.json", name="llama2-7b")
    assert spec == load_model("llama2-7b")
    assert spec.num_parameters() == 6_738_415_616


# --- the key mapping ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("file", sorted(CONFIGS))
def test_keys_map_to_fields(file: str) -> None:
    c = config(file)
    family, hf = hf_model_types()[c["model_type"]]
    spec = from_hf_config(DATA / file)
    assert spec.family == family.name
    for field, key in hf.keys.items():
        if c.get(key) is not None:
            assert getattr(spec, field) == c[key], field
    assert spec.name == file.removesuffix(".json")
    assert spec.tied_embeddings == c.get("tie_word_embeddings", hf.tied)


def test_family_defaults() -> None:
    gpt2 = from_hf_config(DATA / "gpt2.json")  # no n_inner, no tie_word_embeddings
    assert (gpt2.ffn_hidden, gpt2.kv_heads, gpt2.tied_embeddings, gpt2.learned_positions) == (4 * 768, 12, True, True)
    neox = from_hf_config(DATA / "gpt-neox-20b.json")
    assert (neox.family, neox.tied_embeddings, neox.learned_positions, neox.ffn_hidden) == ("gpt", False, False, 24576)
    mistral = from_hf_config(DATA / "mistral-7b-v0.1.json")
    assert (mistral.kv_heads, mistral.head_dim, mistral.seq_len) == (8, 128, 32768)
    assert from_hf_config(DATA / "qwen2.5-0.5b.json").tied_embeddings
    llama = {
        k: v for k, v in config("llama-2-7b.json").items() if k not in ("num_key_value_heads", "tie_word_embeddings")
    }
    assert (from_hf_config(llama).kv_heads, from_hf_config(llama).tied_embeddings) == (
        32,
        False,
    )  # transformers' defaults


def test_name_and_seq_len() -> None:
    assert from_hf_config(config("llama-2-7b.json")).name == "Llama-2-7b-hf"  # a mapping: _name_or_path
    assert from_hf_config(config("gpt2.json")).name == "gpt2"  # a mapping without it: model_type
    spec = from_hf_config(DATA / "mistral-7b-v0.1.json", name="m7", seq_len=4096)
    assert (spec.name, spec.seq_len) == ("m7", 4096)
    short = from_hf_config(DATA / "gpt2.json", seq_len=512)
    assert short.num_parameters() == from_hf_config(DATA / "gpt2.json").num_parameters() - 512 * 768
    assert any("512 rows" in note for note in unmodelled(config("gpt2.json"), short))


def test_notes_on_what_is_not_modelled() -> None:
    mistral = from_hf_config(DATA / "mistral-7b-v0.1.json")
    assert any("sliding-window attention over 4,096" in n for n in unmodelled(config("mistral-7b-v0.1.json"), mistral))
    windowed = from_hf_config(DATA / "mistral-7b-v0.1.json", seq_len=4096)
    assert unmodelled(config("mistral-7b-v0.1.json"), windowed) == []
    assert unmodelled(config("gpt2.json"), from_hf_config(DATA / "gpt2.json")) == []
    assert unmodelled(config("qwen2.5-7b.json"), from_hf_config(DATA / "qwen2.5-7b.json")) == [
        "biases on Q, K and V: 129,024 parameters (0.0017% of 7,615,487,488) not counted"
    ]
    assert len(unmodelled(config("gpt-neox-20b.json"), from_hf_config(DATA / "gpt-neox-20b.json"))) == 2


def test_rotary_gpt_graph_keeps_the_same_bytes() -> None:
    """Without learned positions a GPT block rotates Q and K: the saved bytes of its block stay the same."""
    neox = from_hf_config(DATA / "pythia-160m.json", seq_len=128)
    learned = neox.model_copy(update={"learned_positions": True})
    rotary_graph = build_graph(neox, 2, tp=2, attention="unfused")
    learned_graph = build_graph(learned, 2, tp=2, attention="unfused")
    assert "in.pos" not in rotary_graph and "in.pos" in learned_graph
    assert "L0.rope" in rotary_graph and "L0.rope" not in learned_graph
    assert ("L0.rope", "L0.qk") in rotary_graph.edges

    def saved(graph: Any) -> int:
        return sum(d["saved_bytes"] for _, d in graph.nodes(data=True) if d["layer"] == 0)

    assert saved(rotary_graph) == saved(learned_graph)


def test_torch_model_has_the_same_parameters() -> None:
    torch = pytest.importorskip("torch")
    from plansim.profiling.torch_models import build_model, num_parameters

    for file in ("gpt2.json", "pythia-160m.json", "qwen2.5-0.5b.json"):
        spec = from_hf_config(DATA / file)
        assert num_parameters(build_model(spec, device="meta")) == spec.num_parameters(), file
    shapes = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 128}
    tiny = from_hf_config({**config("pythia-160m.json"), **shapes, "vocab_size": 50}, seq_len=8)
    model = build_model(tiny)
    assert model.positions is None and num_parameters(model) == tiny.num_parameters()
    assert model(torch.randint(0, 50, (2, 8))).shape == (2, 8, 50)


# --- bad input --------------------------------------------------------------------------------------------------


def test_bad_configs_are_one_line_errors(tmp_path: Path) -> None:
    llama = config("llama-2-7b.json")
    one_line_error(lambda: from_hf_config({**llama, "model_type": "dbrx"}), "'dbrx'", "gpt2, gpt_neox")
    one_line_error(lambda: from_hf_config({k: v for k, v in llama.items() if k != "model_type"}), "'model_type'")
    no_ffn = {k: v for k, v in llama.items() if k != "intermediate_size"}
    one_line_error(lambda: from_hf_config(no_ffn), "'intermediate_size'", "feed-forward width", "add it")
    one_line_error(lambda: from_hf_config({**llama, "hidden_size": "4096"}), "'hidden_size'", "positive integer")
    one_line_error(lambda: from_hf_config({**llama, "num_hidden_layers": True}), "'num_hidden_layers'")
    one_line_error(lambda: from_hf_config({**llama, "tie_word_embeddings": "no"}), "'tie_word_embeddings'")
    one_line_error(lambda: from_hf_config({**llama, "head_dim": 64}), "head_dim=64", "128")
    one_line_error(lambda: from_hf_config({**llama, "num_attention_heads": 24}), "heads", "hidden")
    one_line_error(lambda: from_hf_config(DATA / "gpt2.json", seq_len=2048), "seq_len=2048", "1024")
    one_line_error(lambda: from_hf_config(DATA / "gpt2.json", seq_len=0), "seq_len=0")
    no_context = {k: v for k, v in llama.items() if k != "max_position_embeddings"}
    one_line_error(lambda: from_hf_config(no_context), "'max_position_embeddings'", "seq_len")
    assert from_hf_config(no_context, seq_len=1024).seq_len == 1024


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    broken, listed = tmp_path / "broken.json", tmp_path / "list.json"
    broken.write_text('{"model_type": "gpt2",\n "n_layer": }')
    listed.write_text("[1, 2]")
    one_line_error(lambda: from_hf_config(broken), "broken.json", "malformed JSON at line 2")
    one_line_error(lambda: from_hf_config(listed), "list.json", "JSON object")
    one_line_error(lambda: from_hf_config(tmp_path / "none.json"), "none.json", "not found")
    one_line_error(lambda: from_hf_config(tmp_path), "holds no config.json")
    one_line_error(lambda: read_hf_config(tmp_path / "none.json"), "not found")


# --- load_model and the CLI -------------------------------------------------------------------------------------


def test_load_model_reads_configs(tmp_path: Path) -> None:
    assert load_model(str(DATA / "qwen2.5-0.5b.json")) == from_hf_config(DATA / "qwen2.5-0.5b.json")
    model_dir = tmp_path / "Mistral-7B-v0.1"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((DATA / "mistral-7b-v0.1.json").read_text())
    assert load_model(model_dir).name == "Mistral-7B-v0.1"
    assert load_model(str(model_dir / "config.json")).num_parameters() == 7_241_732_096
    one_line_error(lambda: load_model(str(tmp_path / "missing.json")), "missing.json", "not found")


def test_model_yaml_reads_back(tmp_path: Path) -> None:
    for file in CONFIGS:
        spec = from_hf_config(DATA / file)
        path = tmp_path / f"{spec.name}.yaml"
        path.write_text(model_yaml(spec, file, unmodelled(config(file), spec)))
        assert load_model(path) == spec, file


def test_cli_import_writes_a_model_simulate_reads(tmp_path: Path) -> None:
    out = tmp_path / "models" / "llama.yaml"
    result = runner.invoke(app, ["import", str(DATA / "llama-2-7b.json"), "--seq-len", "2048", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "6,738,415,616" in result.output and "2,048" in result.output and "wrote" in result.output
    assert load_model(out) == from_hf_config(DATA / "llama-2-7b.json", seq_len=2048)
    strategy = "dp=1,tp=8,pp=1,micro_batch=1,global_batch=1"
    sim = runner.invoke(app, ["simulate", "--model", str(out), "--hardware", "dgx-a100", "-s", strategy, "-f", "json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.output)["model"] == "llama-2-7b"


def test_cli_import_prints_notes_and_name() -> None:
    result = runner.invoke(app, ["import", str(DATA / "qwen2.5-7b.json"), "--name", "qwen7"])
    assert result.exit_code == 0, result.output
    assert "qwen7" in result.output and "7,615,487,488" in result.output and "biases on Q, K and V" in result.output


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["import", "no/such/config.json"], ["not found"]),
        (["import", str(DATA / "gpt2.json"), "--seq-len", "4096"], ["seq_len=4096", "1024"]),
    ],
)
def test_cli_import_bad_input_is_one_line_exit_2(argv: list[str], words: list[str]) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
