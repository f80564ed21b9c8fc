#include "model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "vec.h"

namespace kvs {

namespace {

// Weight rows served by one dot_q_rows call (each weight block decoded once for them and all
// activation rows), or dequantized together so each activation row is reused from L1.
constexpr int kRowTile = kMaxRows;

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

// Rotates pairs (x[i], x[i + n_rot/2]) of each head (llama.cpp "NEOX" RoPE, used by
// qwen2/qwen3/gemma3 files). x: (n_heads, head_dim); cs: (n_rot/2, 2) as rope_row.
void rope_row_half(float* x, int n_heads, int head_dim, int n_rot, const float* cs) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * c - b * s;
      xh[i + half] = a * s + b * c;
    }
  }
}

// cs (T, head_dim/2, 2): cos/sin of pos * base^(-2i/head_dim) / freq_factor[i] for each row.
void rope_table(const std::vector<int32_t>& pos, int T, int hd, float base, const std::vector<float>& freq_factors,
                std::vector<float>& cs) {
  cs.resize(static_cast<size_t>(T) * hd);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      double theta = pos[t] * std::pow(static_cast<double>(base), -2.0 * i / hd);
      if (!freq_factors.empty()) theta /= freq_factors[i];
      cs[static_cast<size_t>(t) * hd + 2 * i] = static_cast<float>(std::cos(theta));
      cs[static_cast<size_t>(t) * hd + 2 * i + 1] = static_cast<float>(std::sin(theta));
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

const char* const kSupportedArchs = "llama, qwen2, qwen3, qwen3moe, gemma3";

Weight Model::load_stacked(const std::string& name, int64_t n_mat, int64_t rows, int64_t cols) const {
  const GgufTensor* t = file_->find_tensor(name);
  if (t == nullptr) {
    throw std::runtime_error("model file '" + file_->path() + "' lacks tensor '" + name + "'");
  }
  if (t->shape.size() != 3 || t->shape[0] != cols || t->shape[1] != rows || t->shape[2] != n_mat) {
    std::string got;
    for (int64_t d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    throw std::runtime_error("tensor '" + name + "' has shape [" + got + "], expected [" + std::to_string(cols) + ", " +
                             std::to_string(rows) + ", " + std::to_string(n_mat) +
                             "] from the model's hyper-parameters");
  }
  Weight w;
  w.type = static_cast<GgmlType>(t->type);
  w.rows = n_mat * rows;
  w.cols = cols;
  w.row_bytes = row_bytes(w.type, cols);
  w.data = t->data;
  return w;
}

void Model::read_config() {
  ModelConfig& c = cfg_;
  const std::string& path = file_->path();
  c.arch = file_->get_string("general.architecture");
  const bool is_llama = c.arch == "llama", is_qwen2 = c.arch == "qwen2", is_qwen3 = c.arch == "qwen3";
  const bool is_moe = c.arch == "qwen3moe", is_gemma3 = c.arch == "gemma3";
  if (!(is_llama || is_qwen2 || is_qwen3 || is_moe || is_gemma3)) {
    throw std::runtime_error("model architecture '" + c.arch + "' in '" + path +
                             "' is not supported; supported architectures: " + kSupportedArchs);
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
  // A MoE file may omit the dense feed_forward_length (no layer has a dense FFN).
  c.n_ff = is_moe ? static_cast<int>(std::clamp<int64_t>(file_->get_int_or(a + "feed_forward_length", 0), 0, 1 << 24))
                  : positive(a + "feed_forward_length", file_->get_int(a + "feed_forward_length"));
  c.n_ctx_train = positive(a + "context_length", file_->get_int(a + "context_length"));
  c.rope_base = static_cast<float>(file_->get_float_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(file_->get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (c.n_head % c.n_head_kv != 0) {
    throw std::runtime_error("head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                             std::to_string(c.n_head_kv));
  }
  // head_dim: attention.key_length when the file has it (qwen3 and gemma3 heads need not be n_embd / n_head).
  if (file_->find(a + "attention.key_length") != nullptr) {
    c.head_dim = positive(a + "attention.key_length", file_->get_int(a + "attention.key_length"));
  } else {
    if (c.n_embd % c.n_head != 0) {
      throw std::runtime_error("embedding_length " + std::to_string(c.n_embd) + " is not divisible by head_count " +
                               std::to_string(c.n_head) + " and the file has no attention.key_length");
    }
    c.head_dim = c.n_embd / c.n_head;
  }
  const int64_t v_len = file_->get_int_or(a + "attention.value_length", c.head_dim);
  if (v_len != c.head_dim) {
    throw std::runtime_error("attention.value_length " + std::to_string(v_len) + " != key_length " +
                             std::to_string(c.head_dim) + ": K and V heads of different sizes are not supported");
  }
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
  if (c.head_dim > kMaxHeadDim || c.head_dim % 2 != 0 || c.n_head / c.n_head_kv > kMaxGroup) {
    throw std::runtime_error("head_dim " + std::to_string(c.head_dim) + " or GQA group " +
                             std::to_string(c.n_head / c.n_head_kv) +
                             " is outside what the attention kernels support (an even head_dim up to " +
                             std::to_string(kMaxHeadDim) + ", groups up to " + std::to_string(kMaxGroup) + ")");
  }
  if (!(c.rope_base > 0.0f) || !(c.rms_eps > 0.0f) || !std::isfinite(c.rope_base) || !std::isfinite(c.rms_eps)) {
    throw std::runtime_error("rope.freq_base and layer_norm_rms_epsilon must be positive and finite");
  }

  c.rope_style = is_llama ? RopeStyle::kAdjacent : RopeStyle::kHalfSplit;
  c.qkv_bias = is_qwen2;
  c.qk_norm = is_qwen3 || is_moe || is_gemma3;
  c.post_norms = is_gemma3;
  c.ffn_act = is_gemma3 ? FfnAct::kGeluTanh : FfnAct::kSilu;
  c.rope_freqs = file_->find_tensor("rope_freqs.weight") != nullptr;
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.layer_swa.assign(c.n_layer, 0);
  if (is_gemma3) {
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    // Gemma 3 scales queries by query_pre_attn_scalar^-1/2, which GGUF files do not
    // store: it is head_dim for every size but 27B (62 layers), where it is
    // n_embd / n_head (what llama.cpp assumes too).
    if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
    c.sliding_window = positive(a + "attention.sliding_window", file_->get_int(a + "attention.sliding_window"));
    // Local layers' RoPE base: rope.freq_base_swa when present, else Gemma 3's 10000
    // (the file's rope.freq_base, 1e6, is the global layers').
    c.rope_base_swa = static_cast<float>(file_->get_float_or(a + "rope.freq_base_swa", 10000.0));
    if (!(c.rope_base_swa > 0.0f) || !std::isfinite(c.rope_base_swa)) {
      throw std::runtime_error("rope.freq_base_swa must be positive and finite");
    }
    // Layer pattern: attention.sliding_window_pattern as a per-layer array of
    // bools (true: sliding) or as a period P (layer l is global when l % P == P - 1);
    // files without it (all Gemma 3 conversions we know) get Gemma 3's P = 6.
    int period = 6;
    const GgufValue* pat = file_->find(a + "attention.sliding_window_pattern");
    if (pat != nullptr && pat->type == GgufType::ARRAY) {
      if (pat->arr.size() != static_cast<size_t>(c.n_layer)) {
        throw std::runtime_error(a + "attention.sliding_window_pattern has " + std::to_string(pat->arr.size()) +
                                 " entries, expected one per layer (" + std::to_string(c.n_layer) + ")");
      }
      for (int l = 0; l < c.n_layer; ++l) c.layer_swa[l] = pat->arr[l].as_int() != 0 ? 1 : 0;
    } else {
      if (pat != nullptr) period = positive(a + "attention.sliding_window_pattern", pat->as_int());
      for (int l = 0; l < c.n_layer; ++l) c.layer_swa[l] = l % period < period - 1 ? 1 : 0;
    }
  }
  c.layer_kv_index.assign(c.n_layer, 0);
  int n_global = 0;
  c.n_layer_swa = 0;
  for (int l = 0; l < c.n_layer; ++l) c.layer_kv_index[l] = c.layer_swa[l] ? c.n_layer_swa++ : n_global++;
  if (is_moe) {
    c.n_expert = positive(a + "expert_count", file_->get_int(a + "expert_count"));
    c.n_expert_used = positive(a + "expert_used_count", file_->get_int(a + "expert_used_count"));
    c.n_ff_exp = positive(a + "expert_feed_forward_length", file_->get_int(a + "expert_feed_forward_length"));
    if (c.n_expert_used > c.n_expert) {
      throw std::runtime_error("expert_used_count " + std::to_string(c.n_expert_used) + " exceeds expert_count " +
                               std::to_string(c.n_expert));
    }
  }
}

Model::Model(const std::string& path, Residency residency, const Kernels* tiles_for)
    : file_(std::make_unique<GgufFile>(path, residency)) {
  read_config();
  const ModelConfig& c = cfg_;
  const GgufTensor* emb = file_->find_tensor("token_embd.weight");
  if (emb == nullptr || emb->shape.size() != 2) {
    throw std::runtime_error("model file '" + path + "' lacks a 2-D tensor 'token_embd.weight'");
  }
  cfg_.n_vocab = static_cast<int>(std::clamp<int64_t>(emb->shape[1], 0, 1 << 24));
  if (emb->shape[1] <= 0 || emb->shape[1] > (1 << 24)) {
    throw std::runtime_error("token_embd.weight rows = " + std::to_string(emb->shape[1]) + " is out of range");
  }
  tok_embd_ = load_weight("token_embd.weight", c.n_vocab, c.n_embd);
  output_ =
      file_->find_tensor("output.weight") != nullptr ? load_weight("output.weight", c.n_vocab, c.n_embd) : tok_embd_;
  output_norm_ = load_vector("output_norm.weight", c.n_embd);
  if (c.rope_freqs) rope_freqs_ = load_vector("rope_freqs.weight", c.head_dim / 2);
  for (float f : rope_freqs_) {
    if (!(f > 0.0f) || !std::isfinite(f)) {
      throw std::runtime_error("rope_freqs.weight holds " + std::to_string(f) +
                               "; every frequency factor must be positive and finite");
    }
  }

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
    if (c.qkv_bias) {
      L.bq = load_vector(p + "attn_q.bias", q_dim);
      L.bk = load_vector(p + "attn_k.bias", kv_dim);
      L.bv = load_vector(p + "attn_v.bias", kv_dim);
    }
    if (c.qk_norm) {
      L.q_norm = load_vector(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = load_vector(p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) {
      L.post_attn_norm = load_vector(p + "post_attention_norm.weight", c.n_embd);
      L.post_ffn_norm = load_vector(p + "post_ffw_norm.weight", c.n_embd);
    }
    L.ffn_norm = load_vector(p + "ffn_norm.weight", c.n_embd);
    std::vector<const Weight*> mats = {&L.wq, &L.wk, &L.wv, &L.wo};
    if (c.n_expert > 0) {
      L.router = load_weight(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd);
      L.gate_exps = load_stacked(p + "ffn_gate_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd);
      L.up_exps = load_stacked(p + "ffn_up_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd);
      L.down_exps = load_stacked(p + "ffn_down_exps.weight", c.n_expert, c.n_embd, c.n_ff_exp);
      // Every expert counts: a batched step with enough tokens reads them all.
      mats.insert(mats.end(), {&L.router, &L.gate_exps, &L.up_exps, &L.down_exps});
    } else {
      L.gate = load_weight(p + "ffn_gate.weight", c.n_ff, c.n_embd);
      L.up = load_weight(p + "ffn_up.weight", c.n_ff, c.n_embd);
      L.down = load_weight(p + "ffn_down.weight", c.n_embd, c.n_ff);
      mats.insert(mats.end(), {&L.gate, &L.up, &L.down});
    }
    for (const Weight* w : mats) weight_bytes_ += w->row_bytes * w->rows;
    layers_.push_back(std::move(L));
  }
  if (tiles_for != nullptr && tiles_for->weight_tile_types != 0) pack_tiles(tiles_for->weight_tile_types);
  file_->seal();
}

void Model::pack_tiles(uint64_t types) {
  // Each matrix with its rows (tied embeddings share one tensor: packed once, both views marked). An MoE
  // stack is packed where each expert's rows are a multiple of 16, so that every expert (moe_ffn's view
  // at e * rows) starts on a tile.
  const ModelConfig& c = cfg_;
  std::vector<std::pair<Weight*, int64_t>> ws = {{&tok_embd_, tok_embd_.rows}, {&output_, output_.rows}};
  for (LayerWeights& L : layers_) {
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router, &L.gate, &L.up, &L.down}) ws.emplace_back(w, w->rows);
    ws.insert(ws.end(), {{&L.gate_exps, c.n_ff_exp}, {&L.up_exps, c.n_ff_exp}, {&L.down_exps, c.n_embd}});
  }
  std::vector<const uint8_t*> packed;
  for (const auto& [w, rows] : ws) {
    const bool tiled = weight_tiles_type(w->type) && (types & tile_bit(w->type)) != 0;
    if (w->data == nullptr || !tiled || rows <= 0 || rows % kWeightTileRows != 0) continue;
    if (std::find(packed.begin(), packed.end(), w->data) == packed.end()) {
      uint8_t* bytes = file_->writable(w->data);
      if (bytes == nullptr) continue;
      pack_weight_tiles(w->type, bytes, w->rows, w->cols);
      packed.push_back(w->data);
      tile_bytes_ += w->row_bytes * static_cast<size_t>(w->rows);
    }
    w->tiles = true;
  }
}

namespace {

// The matmul asks this for every weight row, so it reads a table built once from
// type_is_quantized (whose lookup in the type list is too slow for a hot loop).
bool is_quantized_type(GgmlType t) {
  static const std::array<bool, 64> quantized = [] {
    std::array<bool, 64> q{};
    for (uint32_t i = 0; i < q.size(); ++i) q[i] = type_is_quantized(static_cast<GgmlType>(i));
    return q;
  }();
  const auto i = static_cast<uint32_t>(t);
  return i < quantized.size() && quantized[i];
}

// out_t (T, rows) = x (T, cols) @ W^T for each target; all targets share x and cols.
// Quantized weights: x is quantized once to int8 blocks (T, cols/32) and rows use
// integer dot products. Float weights: rows are dequantized into an L1 tile.
// Each output element depends only on its weight row and its x row, so results
// are identical whatever T is (batch invariance).
// Each target's rows are cut into tiles of kRowTile (its last tile may be shorter); the
// per-target facts the tiles need (first tile, quantized or not) are found once per call,
// not per row: the 16-sequence profile spent 17% of its step on that bookkeeping.
constexpr size_t kMaxTargets = 4;

// Row r of w as w.cols floats: from the row, or out of its tile (a packed weight).
void dequant_weight_row(const Kernels& kern, const Weight& w, int64_t r, float* dst) {
  if (!w.tiles) {
    kern.dequant_row(w.type, w.row(r), dst, w.cols);
    return;
  }
  thread_local std::vector<uint8_t> row;
  row.resize(w.row_bytes);
  weight_tile_get_row(w.type, w.tile(r / kWeightTileRows), static_cast<int>(r % kWeightTileRows), row.data(), w.cols);
  kern.dequant_row(w.type, row.data(), dst, w.cols);
}

void matmul(const std::vector<MatmulTarget>& targets, const float* x, int T, ThreadPool& pool, const Kernels& kern,
            Workspace& ws) {
  ScopeTimer timer(ws.timers.on ? &ws.timers.weights_s : nullptr);
  const size_t n_targets = targets.size();
  if (n_targets == 0 || n_targets > kMaxTargets) throw std::logic_error("matmul: 1 to 4 targets");
  if (ws.timers.on) {
    for (const auto& tg : targets) ws.timers.weight_bytes += tg.w->row_bytes * static_cast<size_t>(tg.w->rows);
  }
  const int64_t cols = targets[0].w->cols;
  std::array<int64_t, kMaxTargets + 1> first{};  // first[i]: target i's first tile
  std::array<bool, kMaxTargets> quantized{};
  bool any_quantized = false;
  for (size_t i = 0; i < n_targets; ++i) {
    quantized[i] = !ws.float_activations && is_quantized_type(targets[i].w->type);
    any_quantized = any_quantized || quantized[i];
    first[i + 1] = first[i] + (targets[i].w->rows + kRowTile - 1) / kRowTile;
  }
  const int64_t nb = cols / kQK;
  if (any_quantized) {
    fit(ws.xq, static_cast<size_t>(T) * nb);
    pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) kern.quantize_act(x + t * cols, ws.xq.data() + t * nb, cols);
    });
  }
  pool.parallel_for(first[n_targets], [&](int thread, int64_t tb, int64_t te) {
    size_t i = 0;
    for (int64_t tile = tb; tile < te; ++tile) {
      while (tile >= first[i + 1]) ++i;  // a chunk's tiles ascend
      const Weight& w = *targets[i].w;
      float* out = targets[i].out;
      const int64_t r0 = (tile - first[i]) * kRowTile;
      const int n = static_cast<int>(std::min<int64_t>(kRowTile, w.rows - r0));
      if (quantized[i] && w.tiles) {
        // The target's consecutive tiles in one call: one forward stream.
        const int64_t run = std::min(te, first[i + 1]) - tile;
        kern.dot_q_tiles(w.type, w.tile(tile - first[i]), run, ws.xq.data(), nb, T, cols, out + r0, w.rows);
        tile += run - 1;
        continue;
      }
      if (quantized[i]) {
        // One call decodes each weight block once for all T activation rows and serves the tile's rows together.
        const void* rows[kRowTile];
        float* outs[kRowTile];
        for (int j = 0; j < n; ++j) {
          rows[j] = w.row(r0 + j);
          outs[j] = out + r0 + j;
        }
        kern.dot_q_rows(w.type, rows, n, ws.xq.data(), nb, T, cols, outs, w.rows);
        continue;
      }
      float* buf = ws.thread_scratch[thread].data();  // (kRowTile, cols)
      for (int j = 0; j < n; ++j) dequant_weight_row(kern, w, r0 + j, buf + j * cols);
      for (int t = 0; t < T; ++t) {
        const float* xr = x + static_cast<size_t>(t) * cols;
        float* o = out + static_cast<size_t>(t) * w.rows + r0;
        for (int j = 0; j < n; ++j) o[j] = kern.dot_f32(buf + j * cols, xr, static_cast<int>(cols));
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
// Below these sizes attention's loops run on the calling thread: a pool loop costs a wake-up and a
// join (microseconds), as long as ~128 K/V rows of attention or merging ~16K partial floats take.
constexpr int64_t kInlineRows = 128;
constexpr size_t kInlineMergeFloats = 16384;

// Attention of T token rows over one layer's K/V (index `layer` inside pool kv).
// window > 0: row t attends to positions (pos_t - window, pos_t] only (sliding layer).
// row_blocks: (T,) the block table of each row for this pool.
void attention(const ModelConfig& c, int layer, int window, int T, const KvPool& kv,
               const std::vector<const std::vector<int>*>& row_blocks, ThreadPool& pool, const Kernels& kern,
               Workspace& ws) {
  ScopeTimer timer(ws.timers.on ? &ws.timers.attention_s : nullptr);
  const KvGeometry& g = kv.geometry();
  const int hd = c.head_dim, G = c.n_head / c.n_head_kv, bt = g.block_tokens, n_kv = c.n_head_kv;
  const int q_dim = c.n_head * hd, nb = hd / kQK;
  const int chunk = std::max(bt, kChunkPositions / bt * bt);  // a whole number of blocks
  static_assert(kChunkPositions <= kValueTaskRows, "a chunk's V sums must fit attn_accum_tiles");
  const bool int_keys = g.k_format == KvFormat::Q8_0 || g.k_format == KvFormat::Q4_0 || g.k_format == KvFormat::Q8_HEAD;
  const bool tiled = kv.k_tiled();    // keys in 16-row tiles (kv_format.h)
  const bool v_tiled = kv.v_tiled();  // values in 16-row value tiles
  const float scale = c.attn_scale;

  ws.attn_tasks.clear();
  ws.attn_first.resize(static_cast<size_t>(T) * n_kv + 1);
  for (int t = 0; t < T; ++t) {
    const int n_ctx = ws.row_pos[t] + 1;
    const int lo = window > 0 ? std::max(0, n_ctx - window) : 0;
    for (int kh = 0; kh < n_kv; ++kh) {
      ws.attn_first[static_cast<size_t>(t) * n_kv + kh] = static_cast<int>(ws.attn_tasks.size());
      for (int p = lo; p < n_ctx; p += chunk) ws.attn_tasks.push_back({t, kh, p, std::min(n_ctx, p + chunk)});
    }
  }
  ws.attn_first[static_cast<size_t>(T) * n_kv] = static_cast<int>(ws.attn_tasks.size());
  const size_t part = static_cast<size_t>(G) * (hd + 2);  // m (G), l (G), acc (G, hd)
  fit(ws.partials, ws.attn_tasks.size() * part);

  const size_t k_stride = kv.k_row_bytes();  // consecutive slots of one (layer, kv head)
  const size_t v_stride = kv.v_row_bytes();
  if (ws.timers.on) {
    for (const AttnTask& tk : ws.attn_tasks) ws.timers.kv_bytes += (tk.end - tk.begin) * (k_stride + v_stride);
  }
  // A (layer, kv head) run of a block is 16 rows (~1 KB). Inside a KV slab consecutive blocks' runs
  // are adjacent, but a context's blocks need not be consecutive, and the hardware prefetcher alone
  // left the 8k decode waiting on DRAM (the profile's hottest lines were the prefetches themselves,
  // stalled on full miss buffers). Pass 1 asks for the K rows kAheadBlocks blocks on, and for the V
  // rows of the block it scores, both into L2 (prefetcht1): into L1 each prefetch holds an L1 miss
  // buffer for a DRAM round trip, and attention at depth 8000 took 1.35x (f16) and 1.14x (q8_0) the
  // time (bench/ab_builds.py --metric attention_ms, 3 alternated rounds, 2026-12-02). 8 blocks ahead
  // instead of 4 changed nothing.
  constexpr int kAheadBlocks = 4;
  constexpr int kPass2Blocks = 32;  // the next task's key blocks pass 2 asks for (a chunk at block_tokens 16)
  auto prefetch_l2 = [](const uint8_t* p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
  };
  int64_t rows = 0;  // K/V rows the tasks read, for every query head at once
  for (const AttnTask& tk : ws.attn_tasks) rows += tk.end - tk.begin;
  auto run_tasks = [&](int thread, int64_t b, int64_t e) {
    float* s = ws.thread_scratch[thread].data();     // (G, chunk) scores, then weights
    float* qs = s + static_cast<size_t>(G) * chunk;  // (G, hd) queries pre-multiplied by 1/sqrt(hd)
    BlockQ8A qq[kMaxGroup * (kMaxHeadDim / kQK)];    // (G, nb) quantized queries
    std::array<const uint8_t*, kValueTaskRows / kKeyTileRows + 1> v_tiles;  // a task's value tiles
    std::array<const uint8_t*, kPass2Blocks> k_ahead;                       // the next task's key runs
    int prepared_for = -1;
    int k_ready = 0;  // leading key blocks of the task asked for by the one before it
    for (int64_t task = b; task < e; ++task) {
      const AttnTask& tk = ws.attn_tasks[task];
      const std::vector<int>& blocks = *row_blocks[tk.t];
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
      const int last_block = (tk.end - 1) / bt;
      // The first blocks' keys, unless the previous task's pass 2 asked for them (below): k_ready
      // leading blocks of this task have been asked for.
      const int first_block = tk.begin / bt;
      for (int bi = first_block + k_ready; bi <= std::min(last_block, first_block + kAheadBlocks - 1); ++bi) {
        prefetch_l2(kv.k_row(blocks[bi], layer, 0, tk.kh), bt * k_stride);
      }
      k_ready = std::max(k_ready, kAheadBlocks);
      // Pass 1: every score of the chunk, one KV block at a time (a sliding window's
      // chunk may start inside a block: its first run is shorter).
      for (int p0 = tk.begin, cnt; p0 < tk.end; p0 += cnt) {
        const int off = p0 % bt, bi = p0 / bt;
        cnt = std::min(bt - off, tk.end - p0);
        if (bi + kAheadBlocks <= last_block && bi + kAheadBlocks - first_block >= k_ready)
          prefetch_l2(kv.k_row(blocks[bi + kAheadBlocks], layer, 0, tk.kh), bt * k_stride);
        prefetch_l2(kv.v_row(blocks[bi], layer, 0, tk.kh), bt * v_stride);
        if (tiled) {
          // One tile at a time (a run of bt slots is bt / 16 tiles, a window may open inside one).
          const uint8_t* run = kv.k_row(blocks[bi], layer, 0, tk.kh);
          for (int j = 0, tc; j < cnt; j += tc) {
            const int slot = off + j, first = slot / kKeyTileRows * kKeyTileRows;
            tc = std::min(cnt - j, first + kKeyTileRows - slot);
            kern.attn_scores_tile(g.k_format, run + first * k_stride, slot - first, tc, qq, G, hd,
                                  s + (p0 - tk.begin) + j, chunk);
          }
          continue;
        }
        kern.attn_scores(g.k_format, kv.k_row(blocks[bi], layer, off, tk.kh), k_stride, cnt, qs, qq, G, hd,
                         s + (p0 - tk.begin), chunk);
      }
      // Softmax numerators of the chunk (no rescaling needed inside it).
      float* m = ws.partials.data() + task * part;
      float* lsum = m + G;
      float* acc = lsum + G;
      for (int i = 0; i < G; ++i) {
        float* si = s + static_cast<size_t>(i) * chunk;
        m[i] = row_max(si, n);
        lsum[i] = kern.exp_sum(si, n, m[i]);
      }
      // Pass 2: weighted sum of the V rows (in L2 since pass 1). Its sums keep the core busy while
      // the memory is idle, so it asks for the keys of this thread's next task meanwhile, the first
      // kPass2Blocks of them (pass 1 asks for the rest as now): value tiles spread the requests evenly
      // over the call (0.89-0.92x the 8k q8_0 attention time of asking for them all during its first
      // block's pass; q4_0 0.96-0.99), value rows one block per V block.
      const AttnTask* next = task + 1 < e ? &ws.attn_tasks[task + 1] : nullptr;
      const std::vector<int>* next_blocks = next ? row_blocks[next->t] : nullptr;
      const int next_first = next ? next->begin / bt : 0;
      const int next_end = next ? std::min((next->end - 1) / bt + 1, next_first + kPass2Blocks) : 0;
      int next_bi = next_first;
      std::fill(acc, acc + static_cast<size_t>(G) * hd, 0.0f);
      if (v_tiled) {
        // Value tiles: one call for the task (its weights' powers of two span the chunk), its tiles
        // in order (a sliding window's chunk may open inside one); the next task's keys asked for first.
        int n_ahead = 0;
        for (; next_bi < next_end; ++next_bi) {
          k_ahead[n_ahead++] = kv.k_row((*next_blocks)[next_bi], layer, 0, next->kh);
        }
        const int first = tk.begin % kKeyTileRows;
        int nt = 0;
        for (int p = tk.begin - first; p < tk.end; p += kKeyTileRows) {
          v_tiles[nt++] = kv.v_row(blocks[p / bt], layer, p % bt, tk.kh);
        }
        kern.attn_accum_tiles(g.v_format, v_tiles.data(), first, n, s, chunk, acc, G, hd,
                              {k_ahead.data(), n_ahead, bt * k_stride});
      } else {
        for (int p0 = tk.begin, cnt; p0 < tk.end; p0 += cnt) {
          const int off = p0 % bt;
          cnt = std::min(bt - off, tk.end - p0);
          if (next_bi < next_end) {
            prefetch_l2(kv.k_row((*next_blocks)[next_bi], layer, 0, next->kh), bt * k_stride);
            ++next_bi;
          }
          kern.attn_accum(g.v_format, kv.v_row(blocks[p0 / bt], layer, off, tk.kh), v_stride, cnt, s + (p0 - tk.begin),
                          chunk, acc, G, hd);
        }
      }
      k_ready = next_bi - next_first;
      if (ws.attn_first[pair + 1] - ws.attn_first[pair] == 1) {
        // The pair's only chunk: its output is acc / l, the merge's arithmetic for one partial
        // (weight exp(m - m) = 1), written here instead of in a second loop.
        float* out = ws.attn.data() + static_cast<size_t>(tk.t) * q_dim + static_cast<size_t>(tk.kh) * G * hd;
        for (int i = 0; i < G; ++i) {
          const float inv = 1.0f / lsum[i];
          for (int x = 0; x < hd; ++x) out[i * hd + x] = acc[i * hd + x] * inv;
        }
      }
    }
  };
  // A step's attention can be a few rows (a decode step near the start of its context); below
  // kInlineRows the caller runs it alone rather than wake the pool and wait for it.
  if (rows <= kInlineRows) {
    run_tasks(0, 0, static_cast<int64_t>(ws.attn_tasks.size()));
  } else {
    pool.parallel_for(static_cast<int64_t>(ws.attn_tasks.size()), run_tasks);
  }

  // Merge the partial softmaxes of the (token, kv head) pairs whose context spans several chunks.
  ws.attn_merge.clear();
  size_t merge_floats = 0;
  for (int pair = 0; pair < T * n_kv; ++pair) {
    const int tasks = ws.attn_first[pair + 1] - ws.attn_first[pair];
    if (tasks > 1) {
      ws.attn_merge.push_back(pair);
      merge_floats += static_cast<size_t>(tasks) * part;
    }
  }
  auto merge = [&](int, int64_t b, int64_t e) {
    for (int64_t mi = b; mi < e; ++mi) {
      const int pair = ws.attn_merge[mi];
      const int t = pair / n_kv, kh = pair % n_kv;
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
  };
  const auto n_merge = static_cast<int64_t>(ws.attn_merge.size());
  if (merge_floats <= kInlineMergeFloats) {
    merge(0, 0, n_merge);
  } else {
    pool.parallel_for(n_merge, merge);
  }
}

}  // namespace

void moe_route(const float* logits, int E, int K, int32_t* choice, float* weight) {
  thread_local std::vector<float> p;  // (E,) probabilities; thread_local: no allocation per token
  thread_local std::vector<int> order;
  p.assign(logits, logits + E);
  const float mx = *std::max_element(p.begin(), p.end());
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
  for (int e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / sum);
  order.resize(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + K, order.end(),
                    [&](int x, int y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
  double kept = 0.0;
  for (int k = 0; k < K; ++k) kept += p[order[k]];
  for (int k = 0; k < K; ++k) {
    choice[k] = order[k];
    weight[k] = static_cast<float>(p[order[k]] / kept);
  }
}

void Model::moe_ffn(const LayerWeights& L, int T, ThreadPool& pool, const Kernels& kern, Workspace& ws) const {
  const ModelConfig& c = cfg_;
  const int E = c.n_expert, K = c.n_expert_used, d = c.n_embd, F = c.n_ff_exp;
  const size_t st = static_cast<size_t>(T);
  // Router: softmax over the experts, the K most probable (ties: lower id), weights renormalised to sum 1.
  fit(ws.moe_probs, st * E);
  matmul({{&L.router, ws.moe_probs.data()}}, ws.xn.data(), T, pool, kern, ws);
  fit(ws.moe_choice, st * K);
  fit(ws.moe_weight, st * K);
  fit(ws.moe_row, st * K);
  ws.moe_first.assign(static_cast<size_t>(E) + 1, 0);
  for (int t = 0; t < T; ++t) {
    int32_t* choice = ws.moe_choice.data() + static_cast<size_t>(t) * K;
    moe_route(ws.moe_probs.data() + static_cast<size_t>(t) * E, E, K, choice,
              ws.moe_weight.data() + static_cast<size_t>(t) * K);
    for (int k = 0; k < K; ++k) ++ws.moe_first[choice[k] + 1];
  }
  for (int e = 0; e < E; ++e) ws.moe_first[e + 1] += ws.moe_first[e];
  // Group the routed rows by expert (token order inside an expert): moe_in (T*K, d).
  const size_t n_rows = st * K;
  fit(ws.moe_in, n_rows * d);
  fit(ws.moe_gate, n_rows * F);
  fit(ws.moe_up, n_rows * F);
  fit(ws.moe_out, n_rows * d);
  {
    std::vector<int> fill(ws.moe_first.begin(), ws.moe_first.end() - 1);
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) {
        const int row = fill[ws.moe_choice[static_cast<size_t>(t) * K + k]]++;
        ws.moe_row[static_cast<size_t>(t) * K + k] = row;
        std::copy_n(ws.xn.data() + static_cast<size_t>(t) * d, d, ws.moe_in.data() + static_cast<size_t>(row) * d);
      }
    }
  }
  // Each expert's matmuls run once over all its rows, so its weights are read once per step.
  for (int e = 0; e < E; ++e) {
    const int r0 = ws.moe_first[e], n = ws.moe_first[e + 1] - r0;
    if (n == 0) continue;
    auto expert = [e](const Weight& stacked, int64_t rows) {
      Weight w = stacked;
      w.rows = rows;
      w.data = stacked.data + static_cast<size_t>(e) * rows * stacked.row_bytes;
      return w;
    };
    const Weight gate = expert(L.gate_exps, F), up = expert(L.up_exps, F), down = expert(L.down_exps, d);
    float* g = ws.moe_gate.data() + static_cast<size_t>(r0) * F;
    float* u = ws.moe_up.data() + static_cast<size_t>(r0) * F;
    matmul({{&gate, g}, {&up, u}}, ws.moe_in.data() + static_cast<size_t>(r0) * d, n, pool, kern, ws);
    for (int r = 0; r < n; ++r) kern.silu_mul(g + static_cast<size_t>(r) * F, u + static_cast<size_t>(r) * F, F);
    matmul({{&down, ws.moe_out.data() + static_cast<size_t>(r0) * d}}, g, n, pool, kern, ws);
  }
  // xn (T, d) = sum over a token's choices, best first, of weight * expert output.
  for (int t = 0; t < T; ++t) {
    float* o = ws.xn.data() + static_cast<size_t>(t) * d;
    std::fill(o, o + d, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float w = ws.moe_weight[static_cast<size_t>(t) * K + k];
      const float* y = ws.moe_out.data() + static_cast<size_t>(ws.moe_row[static_cast<size_t>(t) * K + k]) * d;
      for (int i = 0; i < d; ++i) o[i] += w * y[i];
    }
  }
}

void Model::forward(const std::vector<BatchItem>& items, KvPool& kv, KvPool* swa_kv, ThreadPool& pool,
                    const Kernels& kern, Workspace& ws, std::vector<float>& logits) const {
  const ModelConfig& c = cfg_;
  if (c.n_layer_swa > 0 && swa_kv == nullptr) {
    throw std::invalid_argument("Model::forward: this model has sliding-window layers and needs their KV pool");
  }
  if (swa_kv != nullptr && swa_kv->geometry().block_tokens != kv.geometry().block_tokens) {
    throw std::invalid_argument("Model::forward: the two KV pools must share block_tokens");
  }
  const int bt = kv.geometry().block_tokens;
  int T = 0, R = 0;
  for (const auto& it : items) {
    T += it.n;
    R += it.n - it.logits_from;
    if (c.n_layer_swa > 0 && it.swa_blocks == nullptr) {
      throw std::invalid_argument("Model::forward: a batch item lacks its sliding-window block table");
    }
  }
  if (T == 0) return;
  const int d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const size_t st = static_cast<size_t>(T);
  const int dense_ff = c.n_expert > 0 ? 0 : c.n_ff;  // a MoE's feed_forward_length is no layer's width

  fit(ws.x, st * d);
  fit(ws.xn, st * std::max(d, dense_ff));
  fit(ws.q, st * q_dim);
  fit(ws.k, st * kv_dim);
  fit(ws.v, st * kv_dim);
  fit(ws.attn, st * q_dim);
  fit(ws.ff_gate, st * dense_ff);
  fit(ws.ff_up, st * dense_ff);
  ws.row_pos.resize(st);
  ws.row_blocks.resize(st);
  ws.row_swa_blocks.resize(st);
  // Per-thread scratch: a matmul tile, or attention's K tile, scores and accumulators.
  const size_t group = static_cast<size_t>(c.n_head / c.n_head_kv);
  const int widest = std::max({c.n_embd, dense_ff, q_dim, c.n_ff_exp});
  const size_t need =
      std::max(static_cast<size_t>(kRowTile) * static_cast<size_t>(widest), group * (kChunkPositions + hd));
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
        ws.row_swa_blocks[t] = it.swa_blocks;
      }
    }
  }

  // RoPE cos/sin per row: (T, head_dim/2, 2), for the global layers and (own base) the sliding ones.
  std::vector<float> rope_cs, rope_cs_swa;
  rope_table(ws.row_pos, T, hd, c.rope_base, rope_freqs_, rope_cs);
  if (c.n_layer_swa > 0) rope_table(ws.row_pos, T, hd, c.rope_base_swa, rope_freqs_, rope_cs_swa);

  if (ws.timers.on) {
    ws.timers.tokens += T;
    ws.timers.weight_bytes += st * tok_embd_.row_bytes;
  }
  pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xr = ws.x.data() + t * d;
      dequant_weight_row(kern, tok_embd_, tokens[t], xr);
      if (c.embd_scale != 1.0f) {
        for (int i = 0; i < d; ++i) xr[i] *= c.embd_scale;
      }
    }
  });

  auto add_rows = [&](float* dst, const float* src) {
    for (size_t i = 0; i < st * d; ++i) dst[i] += src[i];
  };
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = layers_[l];
    const bool swa = c.layer_swa[l] != 0;
    KvPool& P = swa ? *swa_kv : kv;
    const int kl = c.layer_kv_index[l];
    const std::vector<const std::vector<int>*>& tables = swa ? ws.row_swa_blocks : ws.row_blocks;
    const std::vector<float>& cs_table = swa ? rope_cs_swa : rope_cs;

    rmsnorm_rows(ws.x.data(), L.attn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    matmul({{&L.wq, ws.q.data()}, {&L.wk, ws.k.data()}, {&L.wv, ws.v.data()}}, ws.xn.data(), T, pool, kern, ws);
    // Q/K norms, RoPE and the K/V writes, one token row per task (rows write disjoint KV slots).
    pool.parallel_for(T, [&](int, int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        float* q = ws.q.data() + static_cast<size_t>(t) * q_dim;
        float* k = ws.k.data() + static_cast<size_t>(t) * kv_dim;
        float* v = ws.v.data() + static_cast<size_t>(t) * kv_dim;
        if (c.qkv_bias) {
          for (int i = 0; i < q_dim; ++i) q[i] += L.bq[i];
          for (int i = 0; i < kv_dim; ++i) k[i] += L.bk[i], v[i] += L.bv[i];
        }
        if (c.qk_norm) {
          rmsnorm_rows(q, L.q_norm.data(), q, c.n_head, hd, c.rms_eps);
          rmsnorm_rows(k, L.k_norm.data(), k, c.n_head_kv, hd, c.rms_eps);
        }
        const float* cs = cs_table.data() + static_cast<size_t>(t) * hd;
        if (c.rope_style == RopeStyle::kAdjacent) {
          rope_row(q, c.n_head, hd, hd, cs);
          rope_row(k, c.n_head_kv, hd, hd, cs);
        } else {
          rope_row_half(q, c.n_head, hd, hd, cs);
          rope_row_half(k, c.n_head_kv, hd, hd, cs);
        }
        const int pos = ws.row_pos[t];
        const int block = (*tables[t])[pos / bt];
        for (int h = 0; h < c.n_head_kv; ++h) {
          P.store_k_row(block, kl, pos % bt, h, k + h * hd);
          P.store_v_row(block, kl, pos % bt, h, v + h * hd);
        }
      }
    });

    attention(c, kl, swa ? c.sliding_window : 0, T, P, tables, pool, kern, ws);

    matmul({{&L.wo, ws.xn.data()}}, ws.attn.data(), T, pool, kern, ws);
    if (c.post_norms) rmsnorm_rows(ws.xn.data(), L.post_attn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    add_rows(ws.x.data(), ws.xn.data());

    rmsnorm_rows(ws.x.data(), L.ffn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    if (c.n_expert > 0) {
      moe_ffn(L, T, pool, kern, ws);
    } else {
      matmul({{&L.gate, ws.ff_gate.data()}, {&L.up, ws.ff_up.data()}}, ws.xn.data(), T, pool, kern, ws);
      pool.parallel_for(T, [&](int, int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          if (c.ffn_act == FfnAct::kGeluTanh) {
            kern.gelu_tanh_mul(ws.ff_gate.data() + t * c.n_ff, ws.ff_up.data() + t * c.n_ff, c.n_ff);
          } else {
            kern.silu_mul(ws.ff_gate.data() + t * c.n_ff, ws.ff_up.data() + t * c.n_ff, c.n_ff);
          }
        }
      });
      matmul({{&L.down, ws.xn.data()}}, ws.ff_gate.data(), T, pool, kern, ws);
    }
    if (c.post_norms) rmsnorm_rows(ws.xn.data(), L.post_ffn_norm.data(), ws.xn.data(), T, d, c.rms_eps);
    add_rows(ws.x.data(), ws.xn.data());
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
