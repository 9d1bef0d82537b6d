"""The engine on the reference models: the CLI contract, backends, threads, and
every kind of bad input (one line naming the file and tensor or key, exit 2),
all under AddressSanitizer and UndefinedBehaviorSanitizer; and the safetensors
reader fuzzed with 10,000 mutated headers."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from tests import safetensors_io as stio
from tests.conftest import ROOT, SANITIZE, compile_ok, need_tool, run_host, terminal_lines

pytestmark = pytest.mark.slow

MODELS = ROOT / "tests/fixtures/models"
TINY = MODELS / "glm_tiny"


def expected(model: Path) -> dict[str, list[int]]:
    data: dict[str, list[int]] = json.loads((model / "expected.json").read_text())
    return data


def ids(values: list[int]) -> str:
    return ",".join(map(str, values))


# The CPU path a backend is held to: the expanded cache, the form a backend keeps (the
# CPU path's default, the latent cache, gives the same tokens up to rounding).
AS_THE_BACKEND = ("--kv", "expanded")


def tiny_with(folder: Path, **config: object) -> Path:
    """glm_tiny's weights under `folder` (linked), its config with these keys set."""
    folder.mkdir()
    base = json.loads((TINY / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    (folder / "model.safetensors").symlink_to(TINY / "model.safetensors")
    return folder


def run_json(host: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc = run_host(host, *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


@pytest.mark.parametrize("name", ["glm_tiny", "glm_tiny2"])
def test_cpu_matches_the_oracle(sanitized: tuple[Path, Path], name: str) -> None:
    host, _ = sanitized
    model, exp = MODELS / name, expected(MODELS / name)
    tf = run_json(host, "--model", str(model), "--ids", ids(exp["ids"]), "--teacher-force", "--threads", "2")
    assert tf["tf_pred"] == exp["tf_pred"]
    assert tf["backend"] is None and tf["resident_tensors"] == 0 and tf["device"] == "cpu"
    assert tf["backend_calls"] == 0 and tf["backend_seconds"] == 0
    margins = tf["top2_margin"]
    assert isinstance(margins, list) and len(margins) == len(exp["ids"])
    gen = run_json(host, "--model", str(model), "--ids", ids(exp["prompt"]), "--generate", "20")
    assert gen["generated"] == exp["generated"]


@pytest.mark.parametrize("quant", ["f32", "int8", "int4"])
def test_reference_backend_matches_the_cpu_path(sanitized: tuple[Path, Path], quant: str) -> None:
    """--offload matmuls: the dense matmuls in the backend, one call each (those that
    read the same x together), the rest on the CPU."""
    host, ref = sanitized
    for name in ("glm_tiny", "glm_tiny2"):
        exp = expected(MODELS / name)
        base = ["--model", str(MODELS / name), "--ids", ids(exp["ids"]), "--teacher-force", "--quant", quant]
        cpu = run_json(host, *base, *AS_THE_BACKEND)
        dev = run_json(host, *base, "--backend", str(ref), "--offload", "matmuls")
        assert dev["backend"] == "ref" and isinstance(dev["resident_tensors"], int) and dev["resident_tensors"] > 0
        assert dev["tier"] == "matmuls" and dev["step_ops"] == 0 and dev["round_trips"] == 0
        # one forward: every resident tensor's matmul once, those that read the same x
        # in one call (coli_matmul_many), and the time they took is counted
        seconds, total, calls = dev["backend_seconds"], dev["seconds"], dev["backend_calls"]
        assert isinstance(seconds, float) and isinstance(total, float) and isinstance(calls, int)
        assert dev["backend_matmuls"] == dev["resident_tensors"] and 0 < calls < dev["resident_tensors"]
        assert 0 < seconds < total
        assert dev["tf_pred"] == cpu["tf_pred"], (name, quant)
        # the reference backend runs the same arithmetic: the logits agree to the bit
        assert dev["top2_margin"] == cpu["top2_margin"]


@pytest.mark.parametrize("quant", ["f32", "int8", "int4"])
def test_the_whole_step_in_the_reference_backend_matches_the_cpu_path(sanitized: tuple[Path, Path], quant: str) -> None:
    """The default with a backend: each forward one recorded step (ABI 2) with every
    weight, the caches and the activations resident. The reference backend runs each
    op with the CPU path's code, so teacher forcing gives its logits to the bit and a
    greedy decode its tokens with no matmul call and two host copies in all: the first
    id in, the 19 tokens (one batch: each fed to the next step on the device) out."""
    host, ref = sanitized
    for name in ("glm_tiny", "glm_tiny2"):
        exp = expected(MODELS / name)
        base = ["--model", str(MODELS / name), "--quant", quant]
        tf = ["--ids", ids(exp["ids"]), "--teacher-force"]
        cpu, dev = run_json(host, *base, *tf, *AS_THE_BACKEND), run_json(host, *base, *tf, "--backend", str(ref))
        assert dev["tier"] == "step" and dev["backend"] == "ref" and dev["backend_calls"] == 0
        assert isinstance(dev["step_ops"], int) and dev["step_ops"] > 0
        assert dev["round_trips"] == 2  # the ids in, the logits out
        assert isinstance(dev["resident_bytes"], int) and dev["resident_bytes"] > 0
        assert dev["tf_pred"] == cpu["tf_pred"], (name, quant)
        assert dev["top2_margin"] == cpu["top2_margin"]
        gen = ["--ids", ids(exp["prompt"]), "--generate", "20"]
        cpu, dev = run_json(host, *base, *gen, *AS_THE_BACKEND), run_json(host, *base, *gen, "--backend", str(ref))
        assert dev["generated"] == cpu["generated"], (name, quant)
        assert dev["decode_round_trips"] == 2 and dev["backend_calls"] == 0
    # glm_tiny2's index_topk is 8: decoded from a 4-token prompt, the first tokens' queries
    # see all their keys (the indexer selects them all unscored), the later ones more
    exp = expected(MODELS / "glm_tiny2")
    base = ["--model", str(MODELS / "glm_tiny2"), "--quant", quant, "--ids", ids(exp["prompt"][:4]), "--generate", "12"]
    cpu, dev = run_json(host, *base, *AS_THE_BACKEND), run_json(host, *base, "--backend", str(ref))
    assert dev["tier"] == "step" and dev["generated"] == cpu["generated"], quant


def _token_bytes_f32(model: Path) -> tuple[int, int, int]:
    """What a decoded token of `model` reads at f32, from its tensors' shapes: every
    weight once, but one row of the embedding table (and all of it as a tied lm_head)
    and k of E of the routed experts;
    and the CPU path's caches per position: the expanded cache (K's nope part and V per
    head, the rope key the heads share once, the indexer's keys), then the latent one
    (the latent, the rope key, the indexer's keys)."""
    c = json.loads((model / "config.json").read_text())
    total = 0
    tensors = {k: v for f in sorted(model.glob("*.safetensors")) for k, v in stio.read(f).items()}
    for name, (_, shape, _) in tensors.items():
        n = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        if name == "model.embed_tokens.weight":  # a row; the whole table again when it is the lm_head too
            n = 4 * shape[1] + (n if c.get("tie_word_embeddings") else 0)
        elif ".mlp.experts." in name:
            n = n * c["num_experts_per_tok"] // c["n_routed_experts"]
        total += n
    heads, nope, rope, v = (c[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    full = sum(t == "full" for t in c["indexer_types"])
    per_position = [c["num_hidden_layers"] * (part + rope) + full * c["index_head_dim"]
                    for part in (heads * (nope + v), c["kv_lora_rank"])]  # fmt: skip
    return total, 4 * per_position[0], 4 * per_position[1]


def test_the_cpu_path_reports_what_a_token_reads(sanitized: tuple[Path, Path]) -> None:
    """`coli --json` gives every tier the bytes a decoded token reads (the limit a decode
    figure is a share of, bench/engine_speed.py): at f32 the model's own tensors; int8
    and int4 less, int4 least; and the bytes a position of each cache form holds."""
    host, _ = sanitized
    for name in ("glm_tiny", "glm_tiny2"):
        exp = expected(MODELS / name)
        got = {q: run_json(host, "--model", str(MODELS / name), "--quant", q, "--ids", ids(exp["prompt"]),
                           "--generate", "2") for q in ("f32", "int8", "int4")}  # fmt: skip
        weights, expanded_kv, latent_kv = _token_bytes_f32(MODELS / name)
        assert (got["f32"]["token_weight_bytes"], got["f32"]["kv_bytes_per_position"]) == (weights, latent_kv), name
        int8, int4 = (int(str(got[q]["token_weight_bytes"])) for q in ("int8", "int4"))
        assert weights > int8 > int4 > weights / 8
        assert all(g["kv_bytes_per_position"] == latent_kv and g["tier"] == "cpu" for g in got.values())
        expanded = run_json(host, "--model", str(MODELS / name), "--ids", ids(exp["prompt"]), "--generate", "2",
                            *AS_THE_BACKEND)  # fmt: skip
        assert expanded["kv_bytes_per_position"] == expanded_kv > latent_kv, name


def test_threads_do_not_change_results(sanitized: tuple[Path, Path]) -> None:
    host, _ = sanitized
    exp = expected(MODELS / "glm_tiny2")
    base = ["--model", str(MODELS / "glm_tiny2"), "--ids", ids(exp["ids"]), "--teacher-force", "--quant", "int8"]
    one, three = run_json(host, *base, "--threads", "1"), run_json(host, *base, "--threads", "3")
    assert one["top2_margin"] == three["top2_margin"] and one["threads"] == 1 and three["threads"] == 3


def test_a_long_decode_splits_the_indexers_keys_without_changing_tokens(sanitized: tuple[Path, Path]) -> None:
    """Past a few hundred positions a decoded token's indexer scores its keys on every
    thread (one query, many keys): the tokens are those of one thread."""
    import random

    host, _ = sanitized
    rng = random.Random(3)
    prompt = ids([rng.randrange(2, 200) for _ in range(400)])
    base = ["--model", str(MODELS / "glm_tiny2"), "--ids", prompt, "--generate", "6", "--quant", "int8"]
    one, three = run_json(host, *base, "--threads", "1"), run_json(host, *base, "--threads", "3")
    assert one["generated"] == three["generated"] and three["threads"] == 3


@pytest.mark.parametrize("quant", ["f32", "int8", "int4"])
def test_the_latent_cache_gives_the_expanded_caches_tokens(
    sanitized: tuple[Path, Path], tmp_path: Path, quant: str
) -> None:
    """--kv latent (MLA's latent and rope key a position, attention in the absorbed form)
    computes what the expanded cache does up to rounding: the same teacher-forced
    predictions and greedy tokens on both reference models, margins within 1e-4, and
    fewer cache bytes a position. glm_tiny with an indexer that keeps 80 keys, over 200
    positions, takes the paths a long context does: selected keys apart (their rows
    gathered) and a decoded token's keys in blocks over threads."""
    import random

    host, _ = sanitized
    sparse = tiny_with(tmp_path / "sparse", index_topk=80)
    rng = random.Random(5)
    long_prompt = [rng.randrange(2, 200) for _ in range(200)]
    cases = [(MODELS / n, expected(MODELS / n)["ids"], expected(MODELS / n)["prompt"])
             for n in ("glm_tiny", "glm_tiny2")]  # fmt: skip
    for model, tf_ids, prompt in [*cases, (sparse, long_prompt, long_prompt)]:
        base = ["--model", str(model), "--quant", quant, "--threads", "3"]
        tf = {kv: run_json(host, *base, "--ids", ids(tf_ids), "--teacher-force", "--kv", kv)
              for kv in ("expanded", "latent")}  # fmt: skip
        gen = {kv: run_json(host, *base, "--ids", ids(prompt), "--generate", "8", "--kv", kv)
               for kv in ("expanded", "latent")}  # fmt: skip
        assert tf["latent"]["kv_cache"] == "latent" and tf["expanded"]["kv_cache"] == "expanded"
        m_exp, m_lat, p_exp, p_lat = (cast(list[Any], tf[kv][key]) for key in ("top2_margin", "tf_pred")
                                      for kv in ("expanded", "latent"))  # fmt: skip
        for a, b, x, y in zip(m_exp, m_lat, p_exp, p_lat, strict=True):
            assert abs(a - b) < 1e-4 and (x == y or a < 1e-4), (model.name, quant)
        assert gen["latent"]["generated"] == gen["expanded"]["generated"], (model.name, quant)
        # a prefill's queries split over the threads: one thread gives the same bits
        one = run_json(host, *base[:-1], "1", "--ids", ids(tf_ids), "--teacher-force", "--kv", "latent")
        assert one["top2_margin"] == tf["latent"]["top2_margin"], (model.name, quant)
        kv_bytes = [int(str(gen[kv]["kv_bytes_per_position"])) for kv in ("expanded", "latent")]
        assert kv_bytes[1] < kv_bytes[0]


def test_the_cache_forms_defaults_and_refusals(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """The CPU path keeps the latent cache unless told otherwise; a named backend the
    expanded one, also where it fails to load and the CPU path runs instead. A backend's
    step keeps the expanded cache, so --kv latent with --backend is a usage error naming
    both, and --kv takes only its two forms."""
    host, ref = sanitized
    base = ["--model", str(TINY), "--ids", "1,2", "--generate", "2"]
    assert run_json(host, *base)["kv_cache"] == "latent"
    assert run_json(host, *base, "--backend", "none", "--kv", "expanded")["kv_cache"] == "expanded"
    stepped = run_json(host, *base, "--backend", str(ref))
    assert stepped["kv_cache"] == "expanded" and stepped["tier"] == "step"
    missing = run_json(host, *base, "--backend", str(tmp_path / "no-such-backend.so"))
    assert missing["kv_cache"] == "expanded" and missing["tier"] == "cpu"
    proc = run_host(host, *base, "--kv", "latent", "--backend", str(ref))
    assert proc.returncode == 2 and "--kv latent runs on the CPU path only" in proc.stderr and str(ref) in proc.stderr
    proc = run_host(host, *base, "--kv", "compressed")
    assert proc.returncode == 2 and "--kv must be expanded or latent: compressed" in proc.stderr
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize("quant", ["f32", "int8", "int4"])
def test_vector_and_portable_loops_agree_to_the_bit(sanitized: tuple[Path, Path], quant: str) -> None:
    """The AVX2 loops (chosen at run time) and the portable ones do the same operations in the same order."""
    host, _ = sanitized
    exp = expected(MODELS / "glm_tiny2")
    base = ["--model", str(MODELS / "glm_tiny2"), "--ids", ids(exp["ids"]), "--teacher-force", "--quant", quant]
    fast, portable = run_json(host, *base), run_json(host, *base, env={"COLI_CPU_PORTABLE": "1"})
    assert fast["tf_pred"] == portable["tf_pred"] and fast["top2_margin"] == portable["top2_margin"]


def test_a_backend_that_cannot_start_leaves_the_cpu_path(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host, _ = sanitized
    exp = expected(TINY)
    junk = tmp_path / "libcoli_cuda.so"
    junk.write_text("not a library")
    for backend in (str(tmp_path / "missing.so"), str(junk)):
        proc = run_host(
            host, "--model", str(TINY), "--ids", ids(exp["ids"]), "--teacher-force", "--json", "--backend", backend
        )
        assert proc.returncode == 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "GPU tier disabled (CPU path remains active)" in lines[0]
        data = json.loads(proc.stdout)
        assert data["backend"] is None and data["resident_tensors"] == 0 and data["backend_error"]
        assert data["tf_pred"] == exp["tf_pred"]


def test_a_step_that_does_not_fit_the_device_says_so_and_keeps_the_matmuls(sanitized: tuple[Path, Path]) -> None:
    """The reference backend acting as a device of N bytes (COLI_REF_DEVICE_MEMORY):
    room for the dense linears but not the whole step gives one line with the bytes
    needed and free and the matmuls tier; room for half the linears keeps the rest on
    the CPU; the tokens are the CPU path's every time."""
    host, ref = sanitized
    exp = expected(MODELS / "glm_tiny2")
    base = ["--model", str(MODELS / "glm_tiny2"), "--ids", ids(exp["ids"]), "--teacher-force", "--quant", "int8"]
    cpu = run_json(host, *base, *AS_THE_BACKEND)
    dense = run_json(host, *base, "--backend", str(ref), "--offload", "matmuls")
    whole = run_json(host, *base, "--backend", str(ref))
    assert isinstance(dense["resident_bytes"], int) and isinstance(whole["resident_bytes"], int)
    assert whole["tier"] == "step" and whole["resident_bytes"] > dense["resident_bytes"]
    room = dense["resident_bytes"] + 1000
    proc = run_host(host, *base, "--backend", str(ref), "--json", env={"COLI_REF_DEVICE_MEMORY": str(room)})
    assert proc.returncode == 0, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and re.search(r"the whole step needs (\d+) more bytes on the device, 1000 are free", line)
    needed = int(re.search(r"needs (\d+) more", line).group(1))  # type: ignore[union-attr]
    assert needed >= whole["resident_bytes"] - dense["resident_bytes"], line
    got = json.loads(proc.stdout)
    assert got["tier"] == "matmuls" and got["resident_tensors"] == dense["resident_tensors"]
    assert got["tf_pred"] == cpu["tf_pred"] and got["top2_margin"] == cpu["top2_margin"]
    # the host's estimate covers what the step takes: room for exactly it is enough
    exact = str(dense["resident_bytes"] + needed)
    got = run_json(host, *base, "--backend", str(ref), env={"COLI_REF_DEVICE_MEMORY": exact})
    assert got["tier"] == "step" and got["tf_pred"] == cpu["tf_pred"]
    half = str(dense["resident_bytes"] // 2)
    got = run_json(host, *base, "--backend", str(ref), env={"COLI_REF_DEVICE_MEMORY": half})
    assert got["tier"] == "matmuls" and 0 < got["resident_tensors"] < dense["resident_tensors"]  # type: ignore[operator]
    assert got["tf_pred"] == cpu["tf_pred"] and got["top2_margin"] == cpu["top2_margin"]


def test_human_summary(sanitized: tuple[Path, Path]) -> None:
    host, ref = sanitized
    exp = expected(TINY)
    cpu = ["--model", str(TINY), "--ids", ids(exp["prompt"]), "--generate", "5", "--threads", "2"]
    proc = run_host(host, *cpu)
    assert proc.returncode == 0 and proc.stderr == ""
    assert f"generated 5 tokens on cpu (f32, latent cache): {exp['generated'][:5]}" in proc.stdout
    assert re.search(rf"prefill of {len(exp['prompt'])} positions in [\d.]+ s, decode [\d.]+ tokens/s, 2 threads\n",
                     proc.stdout), proc.stdout  # fmt: skip
    proc = run_host(host, "--model", str(TINY), "--ids", ids(exp["ids"]), "--teacher-force", "--kv", "expanded")
    assert f"teacher forcing {len(exp['ids'])} positions on cpu (f32, expanded cache): {exp['tf_pred']}" in proc.stdout
    args = ["--model", str(TINY), "--ids", ids(exp["prompt"]), "--generate", "5", "--backend", str(ref)]
    proc = run_host(host, *args, "--offload", "matmuls")
    assert proc.returncode == 0
    assert f"generated 5 tokens on CPU reference (f32, expanded cache): {exp['generated'][:5]}" in proc.stdout
    # the decode's share in the backend: 4 steps after the first token, each tensor once a step
    resident = int(re.search(r"(\d+) tensors resident in ref", proc.stdout).group(1))  # type: ignore[union-attr]
    line = rf"decode [\d.]+ tokens/s, \d+% of it in \d+ backend calls \({4 * resident} matmuls\), "
    assert re.search(line, proc.stdout), proc.stdout
    assert "51 tensors resident in ref" in proc.stdout
    proc = run_host(host, *args)  # the whole step: every weight resident, no matmul calls
    assert proc.returncode == 0 and "backend calls" not in proc.stdout
    assert re.search(r"decode [\d.]+ tokens/s, \d+ ops a token in one step, 106 tensors resident in ref", proc.stdout)


def test_a_run_past_max_position_embeddings_warns_and_goes_on(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """Positions past the config's max_position_embeddings: one warning line naming both,
    and the tokens transformers would give (RoPE is defined at every position)."""
    host, _ = sanitized
    short = tiny_with(tmp_path / "short", max_position_embeddings=4)
    args = ["--ids", "5,17,42", "--generate", "3", "--json"]
    past, within = run_host(host, "--model", str(short), *args), run_host(host, "--model", str(TINY), *args)
    assert past.returncode == 0 and within.returncode == 0 and within.stderr == ""
    assert past.stderr == "coli: warning: 6 positions run past the model's max_position_embeddings (4)\n"
    assert json.loads(past.stdout)["generated"] == json.loads(within.stdout)["generated"]


def test_progress_line(sanitized: tuple[Path, Path]) -> None:
    """A long run's progress on stderr (shown where stderr is a terminal, or with
    COLI_PROGRESS=1): the prefill's layers, then the decode's tokens, each line drawn over
    the one before and the last one cleared, so the run's output is unchanged; never with
    COLI_PROGRESS=0."""
    host, _ = sanitized
    exp = expected(TINY)
    base = ["--model", str(TINY), "--ids", ids(exp["prompt"]), "--generate", "5", "--json"]
    quiet = run_host(host, *base, env={"COLI_PROGRESS": "0"})
    # bytes: text mode would read each carriage return as a new line
    env = {"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "detect_leaks=1", "COLI_PROGRESS": "1"}  # every step
    shown = subprocess.run([str(host), *base], capture_output=True, env=env, timeout=300)
    assert quiet.returncode == 0 and shown.returncode == 0 and quiet.stderr == ""
    stderr = shown.stderr.decode()
    assert "\n" not in stderr  # the line only, no other message
    assert json.loads(shown.stdout)["generated"] == json.loads(quiet.stdout)["generated"]
    layers = json.loads((TINY / "config.json").read_text())["num_hidden_layers"]
    lines = stderr.split("\r")
    prefill = [f"coli: prefill of {len(exp['prompt'])} positions: layer {i} of {layers}" for i in range(1, layers + 1)]
    assert lines[0] == "" and [line.rstrip() for line in lines[1 : layers + 1]] == prefill, lines
    for k, line in enumerate(lines[layers + 1 : -2], start=2):
        assert re.fullmatch(rf"coli: decode: {k} of 5 tokens, [\d.]+ tokens/s", line.rstrip()), lines
    assert len(lines) == layers + 4 + 3  # the split's empty head, the layers, 4 decoded tokens, the blank, its tail
    assert lines[-2].strip() == "" and lines[-1] == ""  # the last line blanked out, the cursor at its start
    # on a terminal each line shows its own text alone (a faster rate may be a digit shorter)
    assert terminal_lines(stderr) == [line.rstrip() for line in lines[1:-2]] + ["", ""], lines


# ---- bad input ------------------------------------------------------------


def broken_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(TINY, dest)
    return dest


def expect_error(host: Path, model: Path, *needles: str, token_ids: str = "1,2,3") -> None:
    proc = run_host(host, "--model", str(model), "--ids", token_ids, "--teacher-force")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_empty_and_truncated_files(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host = sanitized[0]
    model = broken_copy(tmp_path)
    st = model / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(b"")
    expect_error(host, model, str(st), "file is empty")
    st.write_bytes(data[:5])
    expect_error(host, model, str(st), "truncated")
    st.write_bytes(data[: len(data) // 2])
    expect_error(host, model, str(st), "outside the data")


def test_header_not_json_and_absurd_size(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host = sanitized[0]
    model = broken_copy(tmp_path)
    st = model / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[8] = ord("[") if data[8] != ord("[") else ord("{")
    data[9] = ord("x")
    st.write_bytes(bytes(data))
    expect_error(host, model, str(st), "header is not JSON")
    st.write_bytes(struct.pack("<Q", 1 << 60) + bytes(data[8:]))
    expect_error(host, model, str(st), "header claims 1152921504606846976 bytes")


def test_lying_entries(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host = sanitized[0]
    model = broken_copy(tmp_path)
    st = model / "model.safetensors"
    tensors = stio.read(TINY / "model.safetensors")
    norm = "model.norm.weight"
    cases: list[tuple[dict[str, dict[str, Any]], list[str]]] = [
        ({norm: {"data_offsets": [0, 10**9]}}, [f"tensor '{norm}'", "outside the data"]),
        ({norm: {"shape": [64]}}, [f"tensor '{norm}'", "bytes for 64 F32 values"]),
        ({norm: {"dtype": "F99"}}, [f"tensor '{norm}'", "unknown dtype 'F99'"]),
        ({norm: {"data_offsets": [0, 512]}}, ["overlap"]),
        ({norm: {"shape": [-1]}}, [f"tensor '{norm}'", "is not a size"]),
    ]
    for patch, needles in cases:
        stio.write(st, tensors, header_patch=patch)
        expect_error(host, model, str(st), *needles)
    # a name listed twice (JSON allows it; the reader may not): the norm's entry written again in front
    stio.write(st, tensors)
    data = st.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    twice = (json.dumps({norm: header[norm]})[:-1] + "," + data[9 : 8 + n].decode()).encode()
    st.write_bytes(struct.pack("<Q", len(twice)) + twice + data[8 + n :])
    expect_error(host, model, str(st), f"tensor '{norm}' is listed twice")


def test_missing_tensor_wrong_shape_unsupported_dtype(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host = sanitized[0]
    model = broken_copy(tmp_path)
    st = model / "model.safetensors"
    tensors = stio.read(TINY / "model.safetensors")
    name = "model.layers.2.self_attn.kv_b_proj.weight"
    stio.write(st, {k: v for k, v in tensors.items() if k != name})
    expect_error(host, model, str(st), f"tensor '{name}' is missing")
    dtype, shape, raw = tensors[name]
    stio.write(st, {**tensors, name: (dtype, [shape[1], shape[0]], raw)})
    expect_error(host, model, f"tensor '{name}' has shape [32, 224], the config needs [224, 32]")
    stio.write(st, {**tensors, name: ("I32", shape, raw)})
    expect_error(host, model, f"tensor '{name}' has dtype I32; supported: F32, F16, BF16")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("hidden_size", "128", "key 'hidden_size' must be an integer, got string"),
        ("num_hidden_layers", 2.5, "key 'num_hidden_layers' must be an integer, got a fraction"),
        ("vocab_size", 0, "key 'vocab_size' is 0"),
        ("model_type", "llama", "model_type 'llama' is not supported (supported: glm_moe_dsa)"),
        ("norm_topk_prob", "yes", "key 'norm_topk_prob' must be true or false"),
        ("rope_parameters", {"rope_type": "yarn"}, "rope_type yarn is not supported"),
        # transformers' older name, read before rope_parameters: a scaling there is not left out
        ("rope_scaling", {"type": "yarn", "factor": 4.0}, "rope_scaling.type yarn is not supported"),
        ("rope_scaling", "linear", "rope_scaling must be an object"),
        ("mlp_layer_types", ["dense"], "key 'mlp_layer_types' must be a list of 5 strings"),
        ("kv_lora_rank", None, "key 'kv_lora_rank' is missing"),
        # a value that computes NaN at every position, refused instead
        ("rms_norm_eps", -1, "key 'rms_norm_eps' is -1, must be a finite number above 0"),
        ("rope_theta", 0, "key 'rope_theta' is 0, must be a finite number above 0"),
        ("routed_scaling_factor", -2.5, "key 'routed_scaling_factor' is -2.5, must be a finite number above 0"),
        # the router's picks: each fault named with its values
        ("n_routed_experts", 2048, "n_routed_experts is 2048, at most 1024"),
        ("n_group", 3, "n_routed_experts 8 must split into n_group 3 groups of 2 or more"),
        ("topk_group", 2, "topk_group 2 is more than n_group 1"),
        ("num_experts_per_tok", 9, "num_experts_per_tok 9 is more than the 8 experts of topk_group 1"),
    ],
)
def test_bad_config_values(sanitized: tuple[Path, Path], tmp_path: Path, key: str, value: object, needle: str) -> None:
    model = broken_copy(tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    (model / "config.json").write_text(json.dumps(cfg))
    expect_error(sanitized[0], model, str(model / "config.json"), needle)


def test_rope_is_read_as_transformers_reads_it(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """The older rope_scaling (its type named "type"), read before rope_parameters, and a
    top-level rope_theta where rope_parameters has none give the same frequencies as
    rope_parameters itself; another theta gives others (each position's top-2 margin)."""
    host = sanitized[0]

    def run(model: Path) -> tuple[object, object]:
        d = run_json(host, "--model", str(model), "--ids", "5,17,42,7,9,11,3,250", "--teacher-force")
        return d["tf_pred"], d["top2_margin"]

    base, slower = run(TINY), {"rope_type": "default", "rope_theta": 5000.0}
    legacy = tiny_with(tmp_path / "legacy", rope_parameters=None, rope_scaling={"type": "default", "rope_theta": 1e4})
    assert run(legacy) == base
    other = run(tiny_with(tmp_path / "other", rope_parameters=slower))
    assert other != base
    assert run(tiny_with(tmp_path / "top", rope_parameters={"rope_type": "default"}, rope_theta=5000.0)) == other
    assert run(tiny_with(tmp_path / "both", rope_parameters={"rope_type": "default"}, rope_scaling=slower)) == other
    assert run(tiny_with(tmp_path / "empty", rope_parameters=slower, rope_scaling={})) == other  # {} is not set


def test_config_not_json_and_missing(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    model = broken_copy(tmp_path)
    (model / "config.json").write_text('{"vocab_size": 256,')
    expect_error(sanitized[0], model, "config.json", "invalid JSON at byte")
    (model / "config.json").unlink()
    expect_error(sanitized[0], model, "config.json", "cannot read: No such file or directory")
    expect_error(sanitized[0], tmp_path / "absent", str(tmp_path / "absent"), "no such model folder")
    expect_error(sanitized[0], model / "model.safetensors", "a file, not a model folder")


def test_token_outside_the_vocabulary(sanitized: tuple[Path, Path]) -> None:
    expect_error(sanitized[0], TINY, "token 256 at position 2 is outside the vocabulary", token_ids="5,17,256")
    proc = run_host(sanitized[0], "--model", str(TINY), "--ids", "5,x", "--teacher-force")
    assert proc.returncode == 2 and "--ids: item 2 is not a token id" in proc.stderr


def test_shard_index_naming_a_missing_tensor(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    model = tmp_path / "m2"
    shutil.copytree(MODELS / "glm_tiny2", model)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.extra.weight"] = "model-00001-of-00004.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    expect_error(sanitized[0], model, "model.extra.weight", "does not hold it")
    index["weight_map"]["model.extra.weight"] = "../../etc/passwd"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    expect_error(sanitized[0], model, "is not a file name in the model folder")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    expect_error(sanitized[0], model, "model.safetensors.index.json: weight_map lists no tensors")
    index["weight_map"]["model.extra.weight"] = "absent.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    expect_error(sanitized[0], model, "absent.safetensors: cannot open: No such file or directory")


def test_a_tensor_missing_from_the_shards_is_named_with_their_index(
    sanitized: tuple[Path, Path], tmp_path: Path
) -> None:
    """The message names the index, which lists the shards, not one shard of them."""
    model = tmp_path / "m2"
    shutil.copytree(MODELS / "glm_tiny2", model)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shard = model / index["weight_map"].pop("model.norm.weight")
    stio.write(shard, {k: v for k, v in stio.read(shard).items() if k != "model.norm.weight"})
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    expect_error(sanitized[0], model, "model.safetensors.index.json: tensor 'model.norm.weight' is missing")


def test_a_tensor_in_two_shards_is_refused(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """A name held by two shards would be read from the first, whatever the index names."""
    model = tmp_path / "m2"
    shutil.copytree(MODELS / "glm_tiny2", model)
    first, second = (model / f"model-0000{i}-of-00004.safetensors" for i in (1, 2))
    name, value = next(iter(stio.read(first).items()))
    stio.write(second, {**stio.read(second), name: value})
    expect_error(sanitized[0], model, f"tensor '{name}' is in both", first.name, second.name)


def test_a_model_in_a_shard_a_tensor_reads_as_its_four_shards(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """Each shard opened once however the index orders its entries, and every name found
    among all the shards' at once: glm_tiny2 written one tensor a file, the index's
    entries in reverse, gives the stored model's predictions and margins."""
    stored = MODELS / "glm_tiny2"
    model = tmp_path / "one a file"
    model.mkdir()
    shutil.copy(stored / "config.json", model / "config.json")
    tensors = {k: v for f in sorted(stored.glob("model-*.safetensors")) for k, v in stio.read(f).items()}
    weight_map = {}
    for i, (name, value) in enumerate(sorted(tensors.items(), reverse=True)):  # the files against the names' order
        weight_map[name] = f"t{i:04d}.safetensors"
        stio.write(model / weight_map[name], {name: value})
    index = {"metadata": {}, "weight_map": dict(reversed(list(weight_map.items())))}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert len(weight_map) > 50

    def run(folder: Path) -> tuple[object, object]:
        d = run_json(sanitized[0], "--model", str(folder), "--ids", "5,17,42,7,9,11,3,250", "--teacher-force")
        return d["tf_pred"], d["top2_margin"]

    assert run(model) == run(stored)


def test_fuzzed_headers_never_crash(tmp_path: Path) -> None:
    need_tool("gcc")
    fuzz = tmp_path / "fuzz"
    compile_ok(
        ["gcc", "-std=c11", *SANITIZE, "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'engine'}",
         str(ROOT / "tests/c/fuzz_safetensors.c"), str(ROOT / "engine/safetensors.c"), str(ROOT / "engine/json.c"),
         str(ROOT / "engine/utf8.c"),
         "-o", str(fuzz)]
    )  # fmt: skip
    for seed_file, n, seed in (
        (MODELS / "glm_tiny2/model-00004-of-00004.safetensors", 10000, 7),
        (TINY / "model.safetensors", 2000, 11),
    ):
        proc = subprocess.run(
            [str(fuzz), str(seed_file), str(tmp_path), str(n), str(seed)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout)
        assert result["iterations"] == n and result["accepted"] + result["refused"] == n
        assert result["refused"] > n // 2 and result["accepted"] > 0  # the mutations reach both outcomes


def test_f16_and_bf16_weights_are_read_exactly(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """glm_tiny rewritten in F16 and in BF16 gives the same logits as the same rounded
    values stored as F32: the engine's half-precision conversions are exact."""
    host = sanitized[0]
    tensors = stio.read(TINY / "model.safetensors")
    exp = expected(TINY)

    def f16(raw: bytes) -> bytes:
        values = struct.unpack(f"<{len(raw) // 4}f", raw)
        return struct.pack(f"<{len(values)}e", *values)

    def bf16(raw: bytes) -> bytes:  # truncation: a valid bf16 value, whatever the rounding
        return b"".join(raw[i + 2 : i + 4] for i in range(0, len(raw), 4))

    def widen_f16(raw: bytes) -> bytes:
        values = struct.unpack(f"<{len(raw) // 2}e", raw)
        return struct.pack(f"<{len(values)}f", *values)

    def widen_bf16(raw: bytes) -> bytes:
        return b"".join(b"\0\0" + raw[i : i + 2] for i in range(0, len(raw), 2))

    margins = []
    for name, narrow, widen, dtype in (("f16", f16, widen_f16, "F16"), ("bf16", bf16, widen_bf16, "BF16")):
        half, wide = tmp_path / f"{name}-half", tmp_path / f"{name}-wide"
        for d in (half, wide):
            d.mkdir()
            shutil.copy(TINY / "config.json", d / "config.json")
        small = {k: (dtype, shape, narrow(raw)) for k, (_, shape, raw) in tensors.items()}
        stio.write(half / "model.safetensors", small)
        stio.write(wide / "model.safetensors", {k: ("F32", s, widen(r)) for k, (_, s, r) in small.items()})
        args = ["--ids", ids(exp["ids"]), "--teacher-force"]
        a = run_json(host, "--model", str(half), *args)
        b = run_json(host, "--model", str(wide), *args)
        assert a["tf_pred"] == b["tf_pred"] and a["top2_margin"] == b["top2_margin"], name
        margins.append(a["top2_margin"])
    assert margins[0] != margins[1]  # the two files really hold different values


@pytest.mark.parametrize("quant", ["f32", "int8", "int4"])
def test_fused_expert_tensors_read_as_per_expert_ones(sanitized: tuple[Path, Path], tmp_path: Path, quant: str) -> None:
    """transformers' in-memory expert layout (mlp.experts.gate_up_proj [E, 2I, H] and
    down_proj [E, H, I]) gives the same logits as one tensor per expert, at every format:
    the routed experts are quantised alike from either."""
    import re
    import shutil

    host = sanitized[0]
    tensors = stio.read(TINY / "model.safetensors")
    layers = sorted({m.group(1) for k in tensors if (m := re.match(r"(model\.layers\.\d+\.mlp\.experts)\.0\.", k))})
    assert layers, "glm_tiny has no routed experts"
    fused = {k: v for k, v in tensors.items() if not re.match(r"model\.layers\.\d+\.mlp\.experts\.\d+\.", k)}
    for prefix in layers:
        n = sum(1 for k in tensors if k.startswith(prefix + ".") and k.endswith(".gate_proj.weight"))
        part = [[tensors[f"{prefix}.{j}.{p}.weight"] for j in range(n)] for p in ("gate_proj", "up_proj", "down_proj")]
        (dtype, (inter, hidden), _) = part[0][0]
        gate_up = b"".join(part[0][j][2] + part[1][j][2] for j in range(n))
        fused[f"{prefix}.gate_up_proj"] = (dtype, [n, 2 * inter, hidden], gate_up)
        fused[f"{prefix}.down_proj"] = (dtype, [n, hidden, inter], b"".join(t[2] for t in part[2]))
    model = tmp_path / "fused"
    model.mkdir()
    shutil.copy(TINY / "config.json", model / "config.json")
    stio.write(model / "model.safetensors", fused)
    exp = expected(TINY)
    base = ["--ids", ids(exp["ids"]), "--teacher-force", "--quant", quant]
    per_expert, together = run_json(host, "--model", str(TINY), *base), run_json(host, "--model", str(model), *base)
    assert together["tf_pred"] == per_expert["tf_pred"] and together["top2_margin"] == per_expert["top2_margin"]
    if quant == "f32":
        assert together["tf_pred"] == exp["tf_pred"]


def test_the_vector_loops_give_the_portable_bits_on_odd_sizes(
    gen_dir: Path, asan_kernels: list[str], tmp_path: Path
) -> None:
    """The CPU matmuls at every format on 3,000 random shapes (tails, one row, one
    column, int4 groups of 2 to 128), under ASan/UBSan: each output within rounding of
    a double-precision sum, and the vector loops' bits equal to the portable loops'. On
    this machine's every SIMD level: AVX-512 VNNI with GFNI (int4's nibbles by an affine
    map), AVX-512 VNNI (int4's byte products), AVX2 and the portable loops. int4 against
    x as integers also at x * 2^-110, with an inf or NaN and with zeros, and on x's digits
    made once for rows in two calls (the engine's shared digits). Attention over
    several heads in one walk of the keys gives one head at a time's bits, the
    indexer's scores those of one dot at a time, a weighted sum's head alone the bits it
    has among others, the int8 and int4 rows made floats as their formats define them,
    and the quantisers round halves away from zero as lroundf does."""
    exe = tmp_path / "cpu_dot_check"
    inc = [f"-I{gen_dir}", f"-I{ROOT / 'kernels'}"]
    compile_ok(["gcc", "-std=c11", *SANITIZE, *inc, str(ROOT / "tests/c/cpu_dot_check.c"), *asan_kernels,
                "-o", str(exe), "-lm"])  # fmt: skip
    runs = {}
    for env in ({}, {"COLI_CPU_LOOPS": "avx512vnni"}, {"COLI_CPU_LOOPS": "avx2"}, {"COLI_CPU_PORTABLE": "1"}):
        proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        loops, rest = proc.stdout.split(" loops, ")
        digest, shared = rest.split("hash ")[1].split("; ")
        runs[loops] = digest
        # the vector loops take x's digits made once for several calls; the portable has none
        assert (int(shared.split()[0]) > 0) == (loops != "portable"), proc.stdout
    flags = set(Path("/proc/cpuinfo").read_text().split())
    levels = {"portable"} | ({"avx2"} if "avx2" in flags else set())
    if {"avx2", "avx512_vnni", "avx512vl"} <= flags:
        levels.add("avx512vnni")
        if "gfni" in flags:
            levels.add("avx512vnni+gfni")
    assert set(runs) == levels
    assert len(set(runs.values())) == 1, runs


def test_latent_attention_within_rounding_and_its_split_exact(
    gen_dir: Path, asan_kernels: list[str], tmp_path: Path
) -> None:
    """Attention over the latent cache on 400 random caches, selections and sizes (one
    key to several blocks, keys apart and side by side), under ASan/UBSan: every output
    within rounding of a double-precision softmax and sum, and a decode's blocks run in
    any order then combined give the one-walk bits, and the vector loops the portable
    loops' bits."""
    exe = tmp_path / "latent_check"
    compile_ok(["gcc", "-std=c11", *SANITIZE, f"-I{gen_dir}", f"-I{ROOT / 'kernels'}",
                str(ROOT / "tests/c/latent_check.c"), *asan_kernels, "-o", str(exe), "-lm"])  # fmt: skip
    hashes = set()
    for env in ({}, {"COLI_CPU_LOOPS": "avx2"}, {"COLI_CPU_PORTABLE": "1"}):
        proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert proc.returncode == 0 and "split bits equal" in proc.stdout, proc.stdout + proc.stderr
        hashes.add(proc.stdout.split("hash ")[1].strip())
    assert len(hashes) == 1, hashes  # every SIMD level's bits


def test_the_indexers_selection_is_a_sorts_first_k(gen_dir: Path, asan_kernels: list[str], tmp_path: Path) -> None:
    """The indexer keeps its top-k keys by selection, not a full sort (a radix selection,
    then the tie at the cut by quickselect): on 20,000 random arrays with many ties, zeros
    of both signs and wide magnitudes, under ASan/UBSan, the set is the sorted order's
    first k."""
    exe = tmp_path / "topk_check"
    inc = [f"-I{gen_dir}", f"-I{ROOT / 'kernels'}", f"-I{ROOT / 'engine'}"]
    compile_ok(["gcc", "-std=c11", *SANITIZE, *inc, str(ROOT / "tests/c/topk_check.c"), *asan_kernels,
                "-o", str(exe), "-lm", "-lpthread"])  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    want = "coli_select_first and coli_index_select == qsort prefix on 20000 arrays"
    assert proc.returncode == 0 and want in proc.stdout, proc.stdout
