"""Write a synthetic glm_moe_dsa model (random weights, numpy only) for speed runs.

    python3 bench/make_synthetic.py OUT_DIR [--preset large|many-tensors] [--seed N] [--shards N]

'large' is the issue's larger model: hidden 2048, 16 layers, 64 experts,
vocab 32000 (other sizes below). Weights are float32 with std 1/sqrt(fan_in),
streamed to model.safetensors one tensor at a time (or to N shards and their index,
the same tensors: the same seed gives the same model either way).
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

LARGE: dict[str, object] = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    moe_intermediate_size=128,
    num_hidden_layers=16,
    first_k_dense_replace=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_routed_experts=64,
    num_experts_per_tok=4,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    q_lora_rank=512,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    index_topk=2048,
    index_head_dim=64,
    index_n_heads=8,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
)
PRESETS: dict[str, dict[str, object]] = {
    "large": LARGE,
    # a wide MoE's tensor count (92 layers of 160 experts: about 46,000 tensors) at tiny
    # sizes (0.19 GB), for how a load scales with the count rather than with the bytes
    "many-tensors": dict(
        LARGE,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=16,
        num_hidden_layers=92,
        first_k_dense_replace=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=160,
        num_experts_per_tok=8,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        index_topk=64,
        index_head_dim=16,
        index_n_heads=2,
    ),
}


def shapes(c: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    H, L = c["hidden_size"], c["num_hidden_layers"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (c["vocab_size"], H))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (H,)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "self_attn.q_a_proj.weight", (c["q_lora_rank"], H)),
            (p + "self_attn.q_a_layernorm.weight", (c["q_lora_rank"],)),
            (p + "self_attn.q_b_proj.weight", (c["num_attention_heads"] * qk, c["q_lora_rank"])),
            (p + "self_attn.kv_a_proj_with_mqa.weight", (c["kv_lora_rank"] + c["qk_rope_head_dim"], H)),
            (p + "self_attn.kv_a_layernorm.weight", (c["kv_lora_rank"],)),
            (p + "self_attn.kv_b_proj.weight",
             (c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])),
            (p + "self_attn.o_proj.weight", (H, c["num_attention_heads"] * c["v_head_dim"])),
            (p + "self_attn.indexer.wq_b.weight", (c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"])),
            (p + "self_attn.indexer.wk.weight", (c["index_head_dim"], H)),
            (p + "self_attn.indexer.k_norm.weight", (c["index_head_dim"],)),
            (p + "self_attn.indexer.k_norm.bias", (c["index_head_dim"],)),
            (p + "self_attn.indexer.weights_proj.weight", (c["index_n_heads"], H)),
        ]  # fmt: skip
        if i < c["first_k_dense_replace"]:
            inter = c["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (inter, H)), (p + "mlp.up_proj.weight", (inter, H)),
                    (p + "mlp.down_proj.weight", (H, inter))]  # fmt: skip
            continue
        inter, S = c["moe_intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
        out += [(p + "mlp.gate.weight", (c["n_routed_experts"], H)),
                (p + "mlp.gate.e_score_correction_bias", (c["n_routed_experts"],))]  # fmt: skip
        for e in range(c["n_routed_experts"]):
            q = f"{p}mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (inter, H)), (q + "up_proj.weight", (inter, H)),
                    (q + "down_proj.weight", (H, inter))]  # fmt: skip
        out += [(p + "mlp.shared_experts.gate_proj.weight", (S, H)), (p + "mlp.shared_experts.up_proj.weight", (S, H)),
                (p + "mlp.shared_experts.down_proj.weight", (H, S))]  # fmt: skip
    out += [("model.norm.weight", (H,)), ("lm_head.weight", (c["vocab_size"], H))]
    return out


def write_tensors(path: Path, layout: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> int:
    """One safetensors file of `layout`'s tensors in order; their bytes."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in layout:
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in layout:
            if len(shape) == 1:
                base = 0.0 if name.endswith((".bias", "correction_bias")) else 1.0
                t = (base + 0.05 * rng.standard_normal(shape)).astype(np.float32)
            elif "embed_tokens" in name:
                t = rng.standard_normal(shape, dtype=np.float32)
            else:
                t = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
            f.write(t.tobytes())
    return offset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", default="large", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1, help="files, as save_pretrained writes them: the tensors in "
                    "order cut into runs of about equal bytes, and an index of their names sorted")  # fmt: skip
    args = ap.parse_args()
    if args.shards < 1:
        ap.error(f"--shards must be at least 1: {args.shards}")
    cfg = dict(PRESETS[args.preset])
    cfg.update(
        model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        attention_bias=False, dtype="float32", max_position_embeddings=4096,
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    layout = shapes(cfg)  # type: ignore[arg-type]
    rng = np.random.default_rng(args.seed)
    if args.shards == 1:
        total = write_tensors(args.out / "model.safetensors", layout, rng)
    else:
        sizes = [int(np.prod(shape)) * 4 for _, shape in layout]
        ends = np.cumsum(sizes)
        cut = np.searchsorted(ends, ends[-1] * np.arange(1, args.shards) / args.shards)
        runs = np.split(np.arange(len(layout)), cut)
        weight_map: dict[str, str] = {}
        total = 0
        for k, run in enumerate(runs):
            name = f"model-{k + 1:05d}-of-{args.shards:05d}.safetensors"
            part = [layout[i] for i in run]
            total += write_tensors(args.out / name, part, rng)
            weight_map.update((t, name) for t, _ in part)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"{args.out}: {total / 1e9:.2f} GB of float32 weights, {total // 4 / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
