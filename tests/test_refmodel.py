"""Self-checks of the float64 reference model in tests/refmodel.py."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize

# Import the sibling module whether or not tests/ becomes a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import refmodel as rm

# One layer, head_dim 32 (a Q8_0/Q4_0 block), GQA group 2: small enough for scalar loops.
SMALL = {"n_layer": 1, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "n_ff": 64, "vocab": 50}


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "tiny-f32.gguf"
    hp = rm.write_tiny_llama(path, weight_type="F32", seed=1)
    return hp, rm.load_reference(path)


# -- file format ---------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("weight_type", sorted(rm.WEIGHT_TYPES))
def test_write_read_roundtrip(tmp_path, weight_type, tied):
    path = tmp_path / "m.gguf"
    hp = rm.write_tiny_llama(path, weight_type=weight_type, tied=tied, seed=3)
    model = rm.load_reference(path)

    for key, value in model.hparams.items():
        assert hp[key] == value, key
    assert model.hparams["tied"] == tied
    assert ("output.weight" in model.tensors) == (not tied)

    reader = gguf.GGUFReader(str(path))
    assert int(reader.fields["GGUF.version"].contents()) == 3
    assert reader.fields["llama.rope.freq_base"].types == [gguf.GGUFValueType.FLOAT32]
    assert reader.fields["llama.attention.layer_norm_rms_epsilon"].types == [gguf.GGUFValueType.FLOAT32]

    e, d, hkv = hp["n_embd"], hp["head_dim"], hp["n_head_kv"]
    ggml_shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    assert ggml_shapes["token_embd.weight"] == [e, hp["vocab"]]
    assert ggml_shapes["blk.0.attn_k.weight"] == [e, hkv * d]
    assert ggml_shapes["blk.1.attn_output.weight"] == [hp["n_head"] * d, e]
    assert ggml_shapes["blk.1.ffn_down.weight"] == [hp["n_ff"], e]
    assert ggml_shapes["output_norm.weight"] == [e]

    for name, arr in model.tensors.items():
        assert arr.dtype == np.float64
        assert arr.shape == tuple(reversed(ggml_shapes[name]))
        expected = "F32" if arr.ndim == 1 else weight_type
        assert model.tensor_types[name] == expected, name

    # The dequantized weights are close to the generated ones.
    ref = rm.tiny_llama_weights(
        n_layer=hp["n_layer"],
        n_embd=e,
        n_head=hp["n_head"],
        n_head_kv=hkv,
        n_ff=hp["n_ff"],
        vocab=hp["vocab"],
        tied=tied,
        seed=3,
    )
    assert list(ref) == list(model.tensors)
    rel_tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.2, "Q4_1": 0.2}[weight_type]
    for name, w in ref.items():
        err = np.abs(model.tensors[name] - w).max()
        assert err <= rel_tol * np.abs(w).max(), name


def test_f32_dequantizes_exactly(f32_model):
    hp, model = f32_model
    ref = rm.tiny_llama_weights(
        n_layer=hp["n_layer"],
        n_embd=hp["n_embd"],
        n_head=hp["n_head"],
        n_head_kv=hp["n_head_kv"],
        n_ff=hp["n_ff"],
        vocab=hp["vocab"],
        tied=hp["tied"],
        seed=1,
    )
    for name, w in ref.items():
        np.testing.assert_array_equal(model.tensors[name], w.astype(np.float64))
    # Tied output projection is the embedding table itself.
    assert model.output is model.tok_embd


def test_bad_shapes_rejected(tmp_path):
    with pytest.raises(ValueError):
        rm.write_tiny_llama(tmp_path / "a.gguf", weight_type="Q4_0", n_ff=100)
    with pytest.raises(ValueError):
        rm.write_tiny_llama(tmp_path / "b.gguf", weight_type="Q5_0")


# -- forward pass ----------------------------------------------------------------


def test_forward_shape_and_scale(f32_model):
    hp, model = f32_model
    logits = model.forward([1, 2, 3, 250, 7])
    assert logits.shape == (5, hp["vocab"])
    assert logits.dtype == np.float64
    assert np.all(np.isfinite(logits))
    assert 0.5 < logits.std() < 10 and np.abs(logits).max() < 50


def test_attention_at_position_zero_is_v(f32_model):
    hp, model = f32_model
    group = hp["n_head"] // hp["n_head_kv"]
    d = hp["head_dim"]
    for tokens in ([17], [17, 4, 99]):
        x = model.embed(tokens)
        h = rm.rms_norm(x, model.layers[0].attn_norm, model.eps)
        attn = model.attention(0, h)  # (T, H*D)
        v = (h[0] @ model.layers[0].wv.T).reshape(hp["n_head_kv"], d)  # (Hkv, D)
        expected = np.concatenate([v[hq // group] for hq in range(hp["n_head"])])
        np.testing.assert_allclose(attn[0], expected, rtol=1e-12, atol=1e-12)


def test_causal_prefix_consistency(f32_model):
    _, model = f32_model
    tokens = [5, 80, 13, 200, 42, 9]
    full = model.forward(tokens)
    for t in (1, 3, 5):
        np.testing.assert_allclose(model.forward(tokens[:t]), full[:t], rtol=1e-12, atol=1e-12)


def test_identity_roundtrip_matches_default(f32_model):
    _, model = f32_model
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    ident = (lambda k: k, lambda v: v)
    np.testing.assert_array_equal(model.forward(tokens, kv_roundtrip=ident), model.forward(tokens))
    # A lossy KV cache moves the logits, a little.
    lossy = model.forward(tokens, kv_roundtrip=(rm.rt_q4_0, rm.rt_q4_0))
    diff = np.abs(lossy - model.forward(tokens)).max()
    assert 0 < diff < 2.0


def test_quantized_weights_close_to_f32(tmp_path, f32_model):
    _, model = f32_model
    tokens = [10, 20, 30, 40]
    ref = model.forward(tokens)
    for wt, tol in (("F16", 0.01), ("Q8_0", 0.5)):
        path = tmp_path / f"{wt}.gguf"
        rm.write_tiny_llama(path, weight_type=wt, seed=1)
        other = rm.load_reference(path).forward(tokens)
        assert np.abs(other - ref).max() < tol, wt


def test_rope_properties():
    rng = np.random.default_rng(0)
    d, base = 32, 10000.0
    q = rng.normal(size=(1, 1, d))
    k = rng.normal(size=(1, 1, d))
    # position 0 is the identity, rotations preserve norms
    np.testing.assert_array_equal(rm.rope_normal(q, np.array([0]), base), q)
    r = rm.rope_normal(q, np.array([57]), base)
    assert np.isclose(np.linalg.norm(r), np.linalg.norm(q))

    # q.k depends only on the relative position
    def dot(m, n):
        return float(np.sum(rm.rope_normal(q, np.array([m]), base) * rm.rope_normal(k, np.array([n]), base)))

    assert np.isclose(dot(7, 3), dot(104, 100))
    # first pair rotates by the position itself (theta_0 = 1)
    e = np.zeros((1, 1, d))
    e[..., 0] = 1.0
    r = rm.rope_normal(e, np.array([1]), base)
    assert np.isclose(r[0, 0, 0], np.cos(1.0)) and np.isclose(r[0, 0, 1], np.sin(1.0))


# -- independent loop implementation --------------------------------------------


def _loop_block(model: rm.RefModel, il: int, x: np.ndarray, fk=None, fv=None) -> np.ndarray:
    """Scalar-loop version of one Llama block, written without the vectorized helpers."""
    fk = fk or (lambda a: a)
    fv = fv or (lambda a: a)
    lw = model.layers[il]
    n_head, n_kv, d = model.n_head, model.n_head_kv, model.head_dim
    t_len, e = x.shape

    def norm(vec, w):
        ms = sum(float(a) * float(a) for a in vec) / len(vec)
        return np.array([vec[i] / np.sqrt(ms + model.eps) * w[i] for i in range(len(vec))])

    def matvec(w, vec):
        return np.array([sum(w[r, c] * vec[c] for c in range(w.shape[1])) for r in range(w.shape[0])])

    def rope(vec, pos):
        out = vec.copy()
        for i in range(d // 2):
            ang = pos * model.rope_base ** (-2.0 * i / d)
            a, b = vec[2 * i], vec[2 * i + 1]
            out[2 * i] = a * np.cos(ang) - b * np.sin(ang)
            out[2 * i + 1] = a * np.sin(ang) + b * np.cos(ang)
        return out

    qs, ks, vs = [], [], []
    for t in range(t_len):
        h = norm(x[t], lw.attn_norm)
        q, k, v = matvec(lw.wq, h), matvec(lw.wk, h), matvec(lw.wv, h)
        qs.append([rope(q[hh * d : (hh + 1) * d], t) for hh in range(n_head)])
        ks.append([fk(rope(k[g * d : (g + 1) * d], t)) for g in range(n_kv)])
        vs.append([fv(v[g * d : (g + 1) * d]) for g in range(n_kv)])

    out = np.zeros_like(x)
    for t in range(t_len):
        heads = []
        for hh in range(n_head):
            g = hh // (n_head // n_kv)
            scores = [float(np.dot(qs[t][hh], ks[j][g])) / np.sqrt(d) for j in range(t + 1)]
            m = max(scores)
            w = [np.exp(s - m) for s in scores]
            z = sum(w)
            heads.append(sum(w[j] / z * vs[j][g] for j in range(t + 1)))
        x1 = x[t] + matvec(lw.wo, np.concatenate(heads))
        h2 = norm(x1, lw.ffn_norm)
        gate, up = matvec(lw.w_gate, h2), matvec(lw.w_up, h2)
        act = np.array([gate[i] / (1.0 + np.exp(-gate[i])) * up[i] for i in range(len(gate))])
        out[t] = x1 + matvec(lw.w_down, act)
    assert out.shape == (t_len, e)
    return out


@pytest.mark.parametrize("kv", ["none", "q8_0"])
def test_loop_block_matches_vectorized(tmp_path, kv):
    path = tmp_path / "small.gguf"
    rm.write_tiny_llama(path, weight_type="Q8_0", seed=5, tied=False, **SMALL)
    model = rm.load_reference(path)
    tokens = [7, 3, 41]
    fk = fv = rm.rt_q8_0 if kv == "q8_0" else None
    roundtrip = (fk, fv) if fk else None

    x = model.embed(tokens)
    np.testing.assert_allclose(model.block(0, x, roundtrip), _loop_block(model, 0, x, fk, fv), rtol=1e-10, atol=1e-10)
    # One layer model: forward == loop block + final norm + output projection.
    xl = _loop_block(model, 0, x, fk, fv)
    logits = np.array(
        [
            [np.dot(model.output[v], rm.rms_norm(xl[t], model.output_norm, model.eps)) for v in range(model.vocab)]
            for t in range(len(tokens))
        ]
    )
    np.testing.assert_allclose(model.forward(tokens, roundtrip), logits, rtol=1e-10, atol=1e-10)


# -- KV storage format emulation ---------------------------------------------------


def _vectors():
    rng = np.random.default_rng(11)
    yield rng.normal(size=128)
    yield rng.normal(size=64) * 1e-3
    yield np.concatenate([np.zeros(32), rng.normal(size=32) * 50])
    yield -np.abs(rng.normal(size=32))
    yield np.zeros(32)


def test_rt_f16():
    for x in _vectors():
        y = rm.rt_f16(x)
        assert y.dtype == np.float64 and y.shape == x.shape
        np.testing.assert_array_equal(y, x.astype(np.float32).astype(np.float16).astype(np.float64))
        np.testing.assert_array_equal(rm.rt_f16(y), y)


@pytest.mark.parametrize(
    "name, qtype", [("rt_q8_0", gguf.GGMLQuantizationType.Q8_0), ("rt_q4_0", gguf.GGMLQuantizationType.Q4_0)]
)
def test_rt_blocks_match_gguf_quants(name, qtype):
    fn = getattr(rm, name)
    for x in _vectors():
        y = fn(x)
        assert y.dtype == np.float64 and y.shape == x.shape
        x32 = x.astype(np.float32)
        expected = dequantize(quantize(x32.reshape(1, -1), qtype), qtype).reshape(-1)
        np.testing.assert_array_equal(y, expected.astype(np.float64))


def test_rt_q4_0_rule():
    # largest-magnitude element keeps its sign and is reproduced (up to f16 of d)
    x = np.linspace(-1.0, 3.0, 32)
    y = rm.rt_q4_0(x)
    d = np.float16(3.0 / -8)
    assert y[-1] == pytest.approx(-8 * float(d))
    assert np.all(np.abs(y - x) <= abs(float(d)) * 0.5 + 1e-3)


def test_rt_q8_head():
    for x in _vectors():
        y = rm.rt_q8_head(x)
        assert y.dtype == np.float64 and y.shape == x.shape
        amax = np.abs(x).max()
        if amax == 0:
            np.testing.assert_array_equal(y, 0)
            continue
        s = np.float32(np.float32(amax) / np.float32(127))
        q = y / float(s)
        np.testing.assert_allclose(q, np.round(q), atol=1e-9)  # integer multiples of s
        assert np.abs(q).max() <= 127
        assert np.abs(y - x).max() <= 0.5 * float(s) * (1 + 1e-5) + 1e-7 * amax
