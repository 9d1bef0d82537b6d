"""Build a reference GLM-MoE-DSA model with transformers and write the tokens
it predicts, so the C engine can be checked against an independent oracle.

    python tools/oracle/make_fixture.py glm_tiny  tests/fixtures/models/glm_tiny
    python tools/oracle/make_fixture.py glm_tiny2 tests/fixtures/models/glm_tiny2
    python tools/oracle/make_fixture.py glm_tiny --check tests/fixtures/models/glm_tiny

Development only (tools/oracle/requirements.txt). Weights are drawn with a
fixed seed and scaled so the logits are decisive; a seed is kept only when no
decision the engine must reproduce (next-token argmax, DSA top-k boundary,
expert top-k boundary) is closer than MARGIN, so float32 summation order cannot
flip it. --check regenerates into a temporary folder and compares.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

MARGIN = 1e-3
PROMPT_LEN = 12
GENERATE = 20

SHAPES: dict[str, dict[str, object]] = {
    # the seed's tiny model
    "glm_tiny": dict(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=5,
        first_k_dense_replace=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=24,
        qk_rope_head_dim=8,
        v_head_dim=32,
        index_topk=4096,
        index_head_dim=16,
        index_n_heads=2,
    ),
    # another shape: interleaved dense/sparse layers, grouped routing without
    # normalisation, a DSA top-k smaller than the sequence with shared indexer
    # layers, tied embeddings, BF16 weights in two shards
    "glm_tiny2": dict(
        vocab_size=384,
        hidden_size=96,
        intermediate_size=80,
        moe_intermediate_size=24,
        num_hidden_layers=4,
        mlp_layer_types=["dense", "sparse", "dense", "sparse"],
        num_attention_heads=3,
        num_key_value_heads=3,
        n_routed_experts=6,
        num_experts_per_tok=3,
        n_group=2,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.5,
        n_shared_experts=2,
        q_lora_rank=48,
        kv_lora_rank=24,
        qk_nope_head_dim=16,
        qk_rope_head_dim=12,
        v_head_dim=20,
        index_topk=8,
        index_head_dim=24,
        index_n_heads=8,
        indexer_types=["full", "shared", "full", "shared"],
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    ),
}
STORAGE = {"glm_tiny": (torch.float32, None), "glm_tiny2": (torch.bfloat16, "200KB")}


def init_weights(model: torch.nn.Module, gen: torch.Generator, dtype: torch.dtype) -> None:
    """Weights of unit-scale activations (std 1/sqrt(fan_in)), rounded to the storage dtype."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 0.0 if name.endswith(".bias") else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                # tied to the LM head, unit-scale embeddings make the model echo its input
                scale = 0.1 if model.config.tie_word_embeddings else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            p.copy_(p.to(dtype).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.05 * torch.randn(b.shape, generator=gen)).to(dtype).to(torch.float32))


def margins(model: GlmMoeDsaForCausalLM, ids: list[int]) -> dict[str, float]:
    """The smallest gap at every discrete decision of one teacher-forced pass."""
    gaps: dict[str, float] = {"logits": math.inf, "dsa": math.inf, "experts": math.inf}
    hooks = []

    def on_indexer(module: torch.nn.Module, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        hidden, q_resid, pos = args[0], args[1], args[2]
        with torch.no_grad():
            cos, sin = pos
            b, s, _ = hidden.shape
            q = module.wq_b(q_resid).view(b, s, module.n_heads, module.head_dim)
            from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

            q_rot, q_pass = torch.split(q, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1)
            k = module.k_norm(module.wk(hidden)).unsqueeze(2)
            k_rot, k_pass = torch.split(k, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1)
            q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q_pass], -1)
            k = torch.cat([k_rot, k_pass], -1).squeeze(2)
            sc = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * module.softmax_scale)
            w = module.weights_proj(hidden).float() * module.n_heads**-0.5
            idx = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]  # [S, T]
            for t in range(s):
                valid = idx[t, : t + 1]
                if valid.numel() > module.index_topk:
                    top = valid.sort(descending=True).values
                    gaps["dsa"] = min(gaps["dsa"], float(top[module.index_topk - 1] - top[module.index_topk]))

    def on_router(module: torch.nn.Module, args: tuple, out: tuple) -> None:
        hidden = args[0].view(-1, module.hidden_dim)
        with torch.no_grad():
            scores = torch.sigmoid(hidden.float() @ module.weight.float().T) + module.e_score_correction_bias
            per_group = scores.view(-1, module.num_group, module.num_experts // module.num_group)
            if module.num_group > 1:
                gs = per_group.topk(2, -1).values.sum(-1).sort(-1, descending=True).values
                gaps["experts"] = min(
                    gaps["experts"], float((gs[:, module.topk_group - 1] - gs[:, module.topk_group]).min())
                )
            group_idx = per_group.topk(2, -1).values.sum(-1).topk(module.topk_group, -1).indices
            mask = torch.zeros(scores.shape[0], module.num_group, dtype=torch.bool)
            mask.scatter_(1, group_idx, True)
            masked = scores.masked_fill(~mask.repeat_interleave(module.num_experts // module.num_group, 1), -math.inf)
            top = masked.sort(-1, descending=True).values
            gaps["experts"] = min(gaps["experts"], float((top[:, module.top_k - 1] - top[:, module.top_k]).min()))

    for layer in model.model.layers:
        if layer.self_attn.indexer is not None:
            hooks.append(layer.self_attn.indexer.register_forward_hook(on_indexer, with_kwargs=True))
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(on_router))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
    finally:
        for h in hooks:
            h.remove()
    top2 = logits.topk(2, -1).values
    per_pos = (top2[:, 0] - top2[:, 1]).tolist()
    gaps["logits"] = min(per_pos)
    gaps["per_position"] = per_pos  # type: ignore[assignment]
    return gaps


def build(name: str, out: Path) -> None:
    dtype, shard = STORAGE[name]
    cfg = GlmMoeDsaConfig(**SHAPES[name])  # type: ignore[arg-type]
    for seed in range(100):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = GlmMoeDsaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
        init_weights(model, gen, dtype)
        prompt = torch.randint(2, cfg.vocab_size, (PROMPT_LEN,), generator=gen).tolist()
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(GENERATE):  # greedy, full recomputation: no cache involved in the oracle
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        gaps = margins(model, ids)
        echoes = sum(a == b for a, b in zip(ids[1:], ids[:-1], strict=False))
        if len(set(ids[PROMPT_LEN:])) < 6 or echoes > 3:
            print(f"{name}: seed {seed} gives a degenerate sequence {ids[PROMPT_LEN:]}; next seed", file=sys.stderr)
            continue
        if min(gaps["logits"], gaps["dsa"], gaps["experts"]) > MARGIN:
            break
        print(
            f"{name}: seed {seed}: a decision is closer than {MARGIN} {gaps['logits'], gaps['dsa'], gaps['experts']}",
            file=sys.stderr,
        )
    else:
        raise SystemExit(f"{name}: no seed in 100 gives margins above {MARGIN}")
    with torch.no_grad():
        tf_pred = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
    assert tf_pred[PROMPT_LEN - 1 : -1] == ids[PROMPT_LEN:], "greedy decode and teacher forcing disagree"
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out, max_shard_size=shard) if shard else model.to(dtype).save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    expected = {
        "model": name,
        "seed": seed,
        "oracle": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, float32, eager",
        "prompt": prompt,
        "generated": ids[PROMPT_LEN:],
        "ids": ids,
        "tf_pred": tf_pred,
        "top2_margin": [round(m, 6) for m in gaps["per_position"]],  # type: ignore[union-attr]
        "min_margins": {k: round(float(v), 6) for k, v in gaps.items() if k != "per_position"},
    }
    # one key per line, lists kept on their line: readable diffs
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in expected.items())
    (out / "expected.json").write_text("{\n" + body + "\n}\n")
    print(f"{name}: seed {seed}, min margins {expected['min_margins']} -> {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare with OUT")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.check:
        build(args.name, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(args.name, Path(tmp))
        cmp = filecmp.dircmp(tmp, args.out)
        if cmp.left_only or cmp.right_only or cmp.diff_files:
            raise SystemExit(
                f"{args.out} differs from a fresh build: {cmp.diff_files + cmp.left_only + cmp.right_only}"
            )
        print(f"{args.out}: identical to a fresh build")


if __name__ == "__main__":
    main()
