#include "model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvs {

namespace {

// Weight rows dequantized together so each activation row is reused from L1
// across several dot products.
constexpr int kRowTile = 8;

// A (weight, output) pair for one fused matmul over several weights that share
// an input: out (T, w->rows) = x (T, cols) @ W^T.
struct MatmulTarget {
  const Weight* w;
  float* out;
};

void rmsnorm_rows(const float* x, const float* weight, float* out, int T, int d, float eps) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * d;
    float* o = out + static_cast<size_t>(t) * d;
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int i = 0; i < d; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

// Rotates adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims of each head
// (llama.cpp "normal" RoPE, which GGUF Llama weights are permuted for).
// x: (n_heads, head_dim); cs: (n_rot/2, 2) cos/sin for this token's position.
void rope_row(float* x, int n_heads, int head_dim, int n_rot, const float* cs) {
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < n_rot / 2; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float a = xh[2 * i], b = xh[2 * i + 1];
      xh[2 * i] = a * c - b * s;
      xh[2 * i + 1] = a * s + b * c;
    }
  }
}

}  // namespace

Weight Model::load_weight(const std::string& name, int64_t rows, int64_t cols) const {
  const GgufTensor* t = file_->find_tensor(name);
  if (t == nullptr) {
    throw std::runtime_error("model file '" + file_->path() + "' lacks tensor '" + name + "'");
  }
  if (t->shape.size() != 2 || t->shape[0] != cols || t->shape[1] != rows) {
    std::string got;
    for (int64_t d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    throw std::runtime_error("tensor '" + name + "' has shape [" + got + "], expected [" + std::to_string(cols) + ", " +
                             std::to_string(rows) + "] from the model's hyper-parameters");
  }
  Weight w;
  w.type = static_cast<GgmlType>(t->type);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = row_bytes(w.type, cols);
  w.data = t->data;
  return w;
}

std::vector<float> Model::load_vector(const std::string& name, int64_t n) const {
  const GgufTensor* t = file_->find_tensor(name);
  if (t == nullptr) {
    throw std::runtime_error("model file '" + file_->path() + "' lacks tensor '" + name + "'");
  }
  if (t->numel() != n) {
    throw std::runtime_error("tensor '" + name + "' has " + std::to_string(t->numel()) + " elements, expected " +
                             std::to_string(n));
  }
  std::vector<float> v(static_cast<size_t>(n));
  kernels_ref().dequant_row(static_cast<GgmlType>(t->type), t->data, v.data(), n);
  return v;
}

Model::Model(const std::string& path) : file_(std::make_unique<GgufFile>(path)) {
  ModelConfig& c = cfg_;
  c.arch = file_->get_string("general.architecture");
  if (c.arch != "llama") {
    throw std::runtime_error("model architecture '" + c.arch + "' in '" + path +
                             "' is not supported; this engine runs Llama-family GGUF models (architecture 'llama')");
  }
  const std::string a = c.arch + ".";
  auto positive = [&](const std::string& key, int64_t v) {
    if (v <= 0 || v > (1 << 24)) {
      throw std::runtime_error("model metadata '" + key + "' = " + std::to_string(v) + " is out of range");
    }
    return static_cast<int>(v);
  };
  c.n_embd = positive(a + "embedding_length", file_->get_int(a + "embedding_length"));
  c.n_layer = positive(a + "block_count", file_->get_int(a + "block_count"));
  c.n_head = positive(a + "attention.head_count", file_->get_int(a + "attention.head_count"));
  c.n_head_kv = positive(a + "attention.head_count_kv", file_->get_int_or(a + "attention.head_count_kv", c.n_head));
  c.n_ff = positive(a + "feed_forward_length", file_->get_int(a + "feed_forward_length"));
  c.n_ctx_train = positive(a + "context_length", file_->get_int(a + "context_length"));
  c.rope_base = static_cast<float>(file_->get_float_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(file_->get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (c.n_embd % c.n_head != 0) {
    throw std::runtime_error("embedding_length " + std::to_string(c.n_embd) + " is not divisible by head_count " +
                             std::to_string(c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0) {
    throw std::runtime_error("head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                             std::to_string(c.n_head_kv));
  }
  c.head_dim = c.n_embd / c.n_head;
  const int64_t n_rot = file_->get_int_or(a + "rope.dimension_count", c.head_dim);
  if (n_rot != c.head_dim) {
    throw std::runtime_error("partial rotary embeddings (rope.dimension_count " + std::to_string(n_rot) +
                             " != head_dim " + std::to_string(c.head_dim) + ") are not supported");
  }
  if (const GgufValue* st = file_->find(a + "rope.scaling.type")) {
    if (st->type == GgufType::STRING && st->s != "none") {
      throw std::runtime_error("RoPE scaling '" + st->s + "' is not supported by this engine");
    }
  }
  if (c.head_dim > kMaxHeadDim || c.n_head / c.n_head_kv > kMaxGroup) {
    throw std::runtime_error("head_dim " + std::to_string(c.head_dim) + " or GQA group " +
                             std::to_string(c.n_head / c.n_head_kv) + " exceeds what the attention kernels support (" +
                             std::to_string(kMaxHeadDim) + ", " + std::to_string(kMaxGroup) + ")");
  }
  if (file_->find_tensor("rope_freqs.weight") != nullptr) {
    throw std::runtime_error("models with a rope_freqs tensor (Llama 3.1-style RoPE scaling) are not supported");
  }
  if (!(c.rope_base > 0.0f) || !(c.rms_eps > 0.0f) || !std::isfinite(c.rope_base) || !std::isfinite(c.rms_eps)) {
    throw std::runtime_error("rope.freq_base and layer_norm_rms_epsilon must be positive and finite");
  }

  const GgufTensor* emb = file_->find_tensor("token_embd.weight");
  if (emb == nullptr || emb->shape.size() != 2) {
    throw std::runtime_error("model file '" + path + "' lacks a 2-D tensor 'token_embd.weight'");
  }
  c.n_vocab = positive("token_embd.weight rows", emb->shape[1]);
  tok_embd_ = load_weight("token_embd.weight", c.n_vocab, c.n_embd);
  output_ =
      file_->find_tensor("output.weight") != nullptr ? load_weight("output.weight", c.n_vocab, c.n_embd) : tok_embd_;
  output_norm_ = load_vector("output_norm.weight", c.n_embd);

  const int q_dim = c.n_head * c.head_dim;
  const int kv_dim = c.n_head_kv * c.head_dim;
  weight_bytes_ = output_.row_bytes * output_.rows;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = load_vector(p + "attn_norm.weight", c.n_embd);
    L.wq = load_weight(p + "attn_q.weight", q_dim, c.n_embd);
    L.wk = load_weight(p + "attn_k.weight", kv_dim, c.n_embd);
    L.wv = load_weight(p + "attn_v.weight", kv_dim, c.n_embd);
    L.wo = load_weight(p + "attn_output.weight", c.n_embd, q_dim);
    L.ffn_norm = load_vector(p + "ffn_norm.weight", c.n_embd);
    L.gate = load_weight(p + "ffn_gate.weight", c.n_ff, c.n_embd);
    L.up = load_weight(p + "ffn_up.weight", c.n_ff, c.n_embd);
    L.down = load_weight(p + "ffn_down.weight", c.n_embd, c.n_ff);
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) {
      weight_bytes_ += w->row_bytes * w->rows;
    }
    layers_.push_back(std::move(L));
  }
}

namespace {

bool is_quantized_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0;
}

// out_t (T, rows) = x (T, cols) @ W^T for each target; all targets share x and cols.
// Quantized weights: x is quantized once to int8 blocks (T, cols/32) and rows use
// integer dot products. Float weights: rows are dequantized into an L1 tile.
// Each output element depends only on its weight row and its x row, so results
// are identical whatever T is (batch invariance).
void matmul(const std::vector<MatmulTarget>& targets, const float* x, int T, ThreadPool& pool, const Kernels& kern,
            Workspace& ws) {
  const int64_t cols = targets[0].w->cols;
  auto is_quantized = [&](GgmlType t) { return !ws.float_activations && is_quantized_type(t); };
  int64_t total_rows = 0;
  bool any_quantized = false;
  for (const auto& tg : targets) {
    total_rows += tg.w->rows;
    any_quantized = any_quantized || is_quantized(tg.w->type);
  }
  const int64_t nb = cols / kQK;
  if (any_quantized) {
    fit(ws.xq, static_cast<size_t>(T) * nb);
    pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) kern.quantize_act(x + t * cols, ws.xq.data() + t * nb, cols);
    });
  }
  const int64_t n_tiles = (total_rows + kRowTile - 1) / kRowTile;
  pool.parallel_for(n_tiles, [&](int thread, int64_t tb, int64_t te) {
    float* buf = ws.thread_scratch[thread].data();  // (kRowTile, cols)
    for (int64_t tile = tb; tile < te; ++tile) {
      // Map the tile's global rows to (target, row); a tile may straddle targets.
      const int64_t g0 = tile * kRowTile;
      const int64_t g1 = std::min(total_rows, g0 + kRowTile);
      const MatmulTarget* tgt[kRowTile];
      int64_t row[kRowTile];
      int n = 0;
      for (int64_t g = g0; g < g1; ++g, ++n) {
        int64_t r = g;
        size_t i = 0;
        while (r >= targets[i].w->rows) r -= targets[i++].w->rows;
        tgt[n] = &targets[i];
        row[n] = r;
        if (!is_quantized(tgt[n]->w->type)) {
          kern.dequant_row(tgt[n]->w->type, tgt[n]->w->row(r), buf + n * cols, cols);
        }
      }
      // Quantized rows: one batched call decodes each weight block once for all T rows.
      for (int j = 0; j < n; ++j) {
        const Weight& w = *tgt[j]->w;
        if (is_quantized(w.type)) {
          if (T == 1) {  // same arithmetic as the batched kernel, with no tile set-up
            tgt[j]->out[row[j]] = kern.dot_q(w.type, w.row(row[j]), ws.xq.data(), cols);
          } else {
            kern.dot_q_batch(w.type, w.row(row[j]), ws.xq.data(), nb, T, cols, tgt[j]->out + row[j], w.rows);
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        const float* xr = x + static_cast<size_t>(t) * cols;
        for (int j = 0; j < n; ++j) {
          const Weight& w = *tgt[j]->w;
          if (!is_quantized(w.type)) {
            tgt[j]->out[static_cast<size_t>(t) * w.rows + row[j]] =
                kern.dot_f32(buf + j * cols, xr, static_cast<int>(cols));
          }
        }
      }
    }
  });
}

// Split-context flash decoding: the positions one (token, kv head) attends to
// are cut into chunks of at most kChunkPositions; each chunk is one task that
// leaves a partial softmax (running max m, denominator l, unnormalised acc) and
// the partials are merged afterwards, so one long context spreads over every
// thread. Each K/V row is read once for all G query heads of its group.
constexpr int kChunkPositions = 512;

void attention(const ModelConfig& c, int layer, int T, const KvPool& kv, ThreadPool& pool, const Kernels& kern,
               Workspace& ws) {
  const KvGeometry& g = kv.geometry();
  const int hd = c.head_dim, G = c.n_head / c.n_head_kv, bt = g.block_tokens, n_kv = c.n_head_kv;
  const int q_dim = c.n_head * hd, nb = hd / kQK;
  const int chunk = std::max(bt, kChunkPositions / bt * bt);  // a whole number of blocks
  const bool int_keys = g.k_format == KvFormat::Q8_0 || g.k_format == KvFormat::Q4_0 || g.k_format == KvFormat::Q8_HEAD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  ws.attn_tasks.clear();
  ws.attn_first.resize(static_cast<size_t>(T) * n_kv + 1);
  for (int t = 0; t < T; ++t) {
    const int n_ctx = ws.row_pos[t] + 1;
    for (int kh = 0; kh < n_kv; ++kh) {
      ws.attn_first[static_cast<size_t>(t) * n_kv + kh] = static_cast<int>(ws.attn_tasks.size());
      for (int p = 0; p < n_ctx; p += chunk) ws.attn_tasks.push_back({t, kh, p, std::min(n_ctx, p + chunk)});
    }
  }
  ws.attn_first[static_cast<size_t>(T) * n_kv] = static_cast<int>(ws.attn_tasks.size());
  const size_t part = static_cast<size_t>(G) * (hd + 2);  // m (G), l (G), acc (G, hd)
  fit(ws.partials, ws.attn_tasks.size() * part);

  const size_t k_stride = kv.k_row_bytes();  // consecutive slots of one (layer, kv head)
  const size_t v_stride = kv.v_row_bytes();
  // Blocks are separate allocations, so the hardware prefetcher stops at each
  // block's end: fetch the next block's rows while scoring the current one.
  auto prefetch = [](const uint8_t* p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
  };
  pool.parallel_for(static_cast<int64_t>(ws.attn_tasks.size()), [&](int thread, int64_t b, int64_t e) {
    float* s = ws.thread_scratch[thread].data();     // (G, chunk) scores, then weights
    float* qs = s + static_cast<size_t>(G) * chunk;  // (G, hd) queries pre-multiplied by 1/sqrt(hd)
    BlockQ8A qq[kMaxGroup * (kMaxHeadDim / kQK)];    // (G, nb) quantized queries
    int prepared_for = -1;
    for (int64_t task = b; task < e; ++task) {
      const AttnTask& tk = ws.attn_tasks[task];
      const std::vector<int>& blocks = *ws.row_blocks[tk.t];
      const int pair = tk.t * n_kv + tk.kh;
      if (prepared_for != pair) {
        const float* q0 = ws.q.data() + static_cast<size_t>(tk.t) * q_dim + static_cast<size_t>(tk.kh) * G * hd;
        for (int x = 0; x < G * hd; ++x) qs[x] = q0[x] * scale;
        if (g.k_format == KvFormat::Q8_HEAD) {
          for (int i = 0; i < G; ++i) quantize_head(qs + static_cast<size_t>(i) * hd, qq + i * nb, hd);
        } else if (int_keys) {
          for (int i = 0; i < G; ++i) kern.quantize_act(qs + static_cast<size_t>(i) * hd, qq + i * nb, hd);
        }
        prepared_for = pair;
      }
      const int n = tk.end - tk.begin;
      // Pass 1: every score of the chunk, one KV block at a time.
      for (int p0 = tk.begin; p0 < tk.end; p0 += bt) {
        const int cnt = std::min(bt, tk.end - p0);
        if (p0 + bt < tk.end) prefetch(kv.k_row(blocks[p0 / bt + 1], layer, 0, tk.kh), bt * k_stride);
        kern.attn_scores(g.k_format, kv.k_row(blocks[p0 / bt], layer, 0, tk.kh), k_stride, cnt, qs, qq, G, hd,
                         s + (p0 - tk.begin), chunk);
      }
      // Softmax numerators of the chunk (no rescaling needed inside it).
      float* m = ws.partials.data() + task * part;
      float* lsum = m + G;
      float* acc = lsum + G;
      for (int i = 0; i < G; ++i) {
        float* si = s + static_cast<size_t>(i) * chunk;
        m[i] = *std::max_element(si, si + n);
        lsum[i] = kern.exp_sum(si, n, m[i]);
      }
      // Pass 2: weighted sum of the V rows.
      std::fill(acc, acc + static_cast<size_t>(G) * hd, 0.0f);
      for (int p0 = tk.begin; p0 < tk.end; p0 += bt) {
        const int cnt = std::min(bt, tk.end - p0);
        if (p0 + bt < tk.end) prefetch(kv.v_row(blocks[p0 / bt + 1], layer, 0, tk.kh), bt * v_stride);
        kern.attn_accum(g.v_format, kv.v_row(blocks[p0 / bt], layer, 0, tk.kh), v_stride, cnt, s + (p0 - tk.begin),
                        chunk, acc, G, hd);
      }
    }
  });

  // Merge the partial softmaxes of each (token, kv head) into the attention output.
  pool.parallel_for(static_cast<int64_t>(T) * n_kv, [&](int, int64_t b, int64_t e) {
    for (int64_t pair = b; pair < e; ++pair) {
      const int t = static_cast<int>(pair / n_kv), kh = static_cast<int>(pair % n_kv);
      const int first = ws.attn_first[pair], last = ws.attn_first[pair + 1];
      float* out = ws.attn.data() + static_cast<size_t>(t) * q_dim + static_cast<size_t>(kh) * G * hd;
      for (int i = 0; i < G; ++i) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int c2 = first; c2 < last; ++c2) mx = std::max(mx, ws.partials[c2 * part + i]);
        float l = 0.0f;
        float* o = out + static_cast<size_t>(i) * hd;
        std::fill(o, o + hd, 0.0f);
        for (int c2 = first; c2 < last; ++c2) {
          const float* pm = ws.partials.data() + c2 * part;
          const float f = std::exp(pm[i] - mx);
          l += pm[G + i] * f;
          kern.axpy_f32(f, pm + 2 * G + static_cast<size_t>(i) * hd, o, hd);
        }
        const float inv = 1.0f / l;
        for (int x = 0; x < hd; ++x) o[x] *= inv;
      }
    }
  });
}

}  // namespace

void Model::forward(const std::vector<BatchItem>& items, KvPool& kv, ThreadPool& pool, const Kernels& kern,
                    Workspace& ws, std::vector<float>& logits) const {
  const ModelConfig& c = cfg_;
  const KvGeometry& g = kv.geometry();
  int T = 0, R = 0;
  for (const auto& it : items) {
    T += it.n;
    R += it.n - it.logits_from;
  }
  if (T == 0) return;
  const int d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const int bt = g.block_tokens;
  const size_t st = static_cast<size_t>(T);

  fit(ws.x, st * d);
  fit(ws.xn, st * std::max(d, c.n_ff));
  fit(ws.q, st * q_dim);
  fit(ws.k, st * kv_dim);
  fit(ws.v, st * kv_dim);
  fit(ws.attn, st * q_dim);
  fit(ws.ff_gate, st * c.n_ff);
  fit(ws.ff_up, st * c.n_ff);
  ws.row_pos.resize(st);
  ws.row_blocks.resize(st);
  // Per-thread scratch: a matmul tile, or attention's K tile, scores and accumulators.
  const size_t group = static_cast<size_t>(c.n_head / c.n_head_kv);
  const size_t need = std::max(static_cast<size_t>(kRowTile) * std::max(c.n_embd, std::max(c.n_ff, q_dim)),
                               group * (kChunkPositions + hd));
  ws.thread_scratch.resize(pool.size());
  for (auto& s : ws.thread_scratch) {
    if (s.size() < need) s.resize(need);
  }

  std::vector<int32_t> tokens(st);
  {
    int t = 0;
    for (const auto& it : items) {
      for (int j = 0; j < it.n; ++j, ++t) {
        tokens[t] = it.tokens[j];
        ws.row_pos[t] = it.pos0 + j;
        ws.row_blocks[t] = it.blocks;
      }
    }
  }

  // RoPE cos/sin per row: (T, head_dim/2, 2)
  std::vector<float> rope_cs(st * hd);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      const double theta = ws.row_pos[t] * std::pow(static_cast<double>(c.rope_base), -2.0 * i / hd);
      rope_cs[static_cast<size_t>(t) * hd + 2 * i] = static_cast<float>(std::cos(theta));
      rope_cs[static_cast<size_t>(t) * hd + 2 * i + 1] = static_cast<float>(std::sin(theta));
    }
  }

  pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      kern.dequant_row(tok_embd_.type, tok_embd_.row(tokens[t]), ws.x.data() + t * d, d);
    }
  });

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = layers_[l];
    rmsnorm_rows(ws.x.data(), L.attn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    matmul({{&L.wq, ws.q.data()}, {&L.wk, ws.k.data()}, {&L.wv, ws.v.data()}}, ws.xn.data(), T, pool, kern, ws);
    // RoPE and the K/V writes, one token row per task (rows write disjoint KV slots).
    pool.parallel_for(T, [&](int, int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const float* cs = rope_cs.data() + static_cast<size_t>(t) * hd;
        rope_row(ws.q.data() + static_cast<size_t>(t) * q_dim, c.n_head, hd, hd, cs);
        rope_row(ws.k.data() + static_cast<size_t>(t) * kv_dim, c.n_head_kv, hd, hd, cs);
        const int pos = ws.row_pos[t];
        const int block = (*ws.row_blocks[t])[pos / bt];
        for (int h = 0; h < c.n_head_kv; ++h) {
          kv_store_row(g.k_format, ws.k.data() + static_cast<size_t>(t) * kv_dim + h * hd,
                       kv.k_row(block, l, pos % bt, h), hd);
          kv_store_row(g.v_format, ws.v.data() + static_cast<size_t>(t) * kv_dim + h * hd,
                       kv.v_row(block, l, pos % bt, h), hd);
        }
      }
    });

    attention(c, l, T, kv, pool, kern, ws);

    matmul({{&L.wo, ws.xn.data()}}, ws.attn.data(), T, pool, kern, ws);
    for (size_t i = 0; i < st * d; ++i) ws.x[i] += ws.xn[i];

    rmsnorm_rows(ws.x.data(), L.ffn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    matmul({{&L.gate, ws.ff_gate.data()}, {&L.up, ws.ff_up.data()}}, ws.xn.data(), T, pool, kern, ws);
    pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        kern.silu_mul(ws.ff_gate.data() + t * c.n_ff, ws.ff_up.data() + t * c.n_ff, c.n_ff);
      }
    });
    matmul({{&L.down, ws.xn.data()}}, ws.ff_gate.data(), T, pool, kern, ws);
    for (size_t i = 0; i < st * d; ++i) ws.x[i] += ws.xn[i];
  }

  // Final norm and output projection only for the rows that need logits.
  fit(ws.logits_in, static_cast<size_t>(R) * d);
  {
    int t = 0, r = 0;
    for (const auto& it : items) {
      for (int j = 0; j < it.n; ++j, ++t) {
        if (j < it.logits_from) continue;
        rmsnorm_rows(ws.x.data() + static_cast<size_t>(t) * d, output_norm_.data(),
                     ws.logits_in.data() + static_cast<size_t>(r) * d, 1, d, c.rms_eps);
        ++r;
      }
    }
  }
  fit(logits, static_cast<size_t>(R) * c.n_vocab);
  if (R > 0) matmul({{&output_, logits.data()}}, ws.logits_in.data(), R, pool, kern, ws);
}

}  // namespace kvs
