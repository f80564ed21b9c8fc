// The model's forward over the backend layer; see device_forward.h.
#include "device_forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace kvs {

namespace {

// A fresh device pool holds this many blocks (it doubles from there as sequences grow).
constexpr size_t kFirstPoolBlocks = 16;

// cs (T, head_dim/2, 2): cos/sin of pos * base^(-2i/head_dim) / freq_factor[i] for each row, computed as
// Model::forward computes its table, so the device turns by the same float angles as the CPU.
void rope_table_host(const std::vector<int32_t>& pos, int hd, float base, const std::vector<float>& freq_factors,
                     std::vector<float>& cs) {
  const size_t T = pos.size();
  cs.resize(T * hd);
  for (size_t t = 0; t < T; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      double theta = pos[t] * std::pow(static_cast<double>(base), -2.0 * i / hd);
      if (!freq_factors.empty()) theta /= freq_factors[i];
      cs[t * hd + 2 * i] = static_cast<float>(std::cos(theta));
      cs[t * hd + 2 * i + 1] = static_cast<float>(std::sin(theta));
    }
  }
}

// Rows r such that r * n floats span a multiple of kBufferViewAlign bytes: the smallest is a power of two.
int rows_per_view_align(int n) {
  return static_cast<int>(kBufferViewAlign / std::gcd(kBufferViewAlign, sizeof(float) * static_cast<size_t>(n)));
}

}  // namespace

DeviceForward::DeviceForward(const Model& model, Backend& backend, const Kernels& kern)
    : model_(model), be_(backend), kern_(kern) {
  const ModelConfig& c = model.config();
  const bool moe = c.n_expert > 0;
  // Check every format before uploading anything, so a refusal costs no device memory.
  auto check = [&](const Weight& w, const std::string& name) {
    if (!be_.has_matmul(w.type)) {
      throw std::invalid_argument("backend " + be_.name() + " has no matmul for weight " + name + " of type " +
                                  type_traits(static_cast<uint32_t>(w.type)).name +
                                  " yet; use backend cpu, or a model file quantized to a format it has "
                                  "(docs/GPU.md lists them)");
    }
  };
  check(model.output(), "output.weight");
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model.layers()[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const auto& [w, n] : {std::pair<const Weight*, const char*>{&L.wq, "attn_q.weight"},
                               {&L.wk, "attn_k.weight"},
                               {&L.wv, "attn_v.weight"},
                               {&L.wo, "attn_output.weight"}}) {
      check(*w, p + n);
    }
    if (moe) {
      check(L.router, p + "ffn_gate_inp.weight");
      check(L.gate_exps, p + "ffn_gate_exps.weight");
      check(L.up_exps, p + "ffn_up_exps.weight");
      check(L.down_exps, p + "ffn_down_exps.weight");
    } else {
      check(L.gate, p + "ffn_gate.weight");
      check(L.up, p + "ffn_up.weight");
      check(L.down, p + "ffn_down.weight");
    }
  }
  if (moe) moe_row_align_ = std::lcm(rows_per_view_align(c.n_embd), rows_per_view_align(c.n_ff_exp));
  output_ = upload_weight(model.output(), "output.weight");
  output_norm_ = upload_vector(model.output_norm());
  layers_.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model.layers()[l];
    DevLayer& D = layers_[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    D.wq = upload_weight(L.wq, p + "attn_q.weight");
    D.wk = upload_weight(L.wk, p + "attn_k.weight");
    D.wv = upload_weight(L.wv, p + "attn_v.weight");
    D.wo = upload_weight(L.wo, p + "attn_output.weight");
    if (moe) {
      D.router = upload_weight(L.router, p + "ffn_gate_inp.weight");
      D.gate_exps = upload_experts(L.gate_exps, c.n_expert, p + "ffn_gate_exps.weight");
      D.up_exps = upload_experts(L.up_exps, c.n_expert, p + "ffn_up_exps.weight");
      D.down_exps = upload_experts(L.down_exps, c.n_expert, p + "ffn_down_exps.weight");
    } else {
      D.gate = upload_weight(L.gate, p + "ffn_gate.weight");
      D.up = upload_weight(L.up, p + "ffn_up.weight");
      D.down = upload_weight(L.down, p + "ffn_down.weight");
    }
    D.attn_norm = upload_vector(L.attn_norm);
    D.ffn_norm = upload_vector(L.ffn_norm);
    if (c.qkv_bias) {
      D.bq = upload_vector(L.bq);
      D.bk = upload_vector(L.bk);
      D.bv = upload_vector(L.bv);
    }
    if (c.qk_norm) {
      D.q_norm = upload_vector(L.q_norm);
      D.k_norm = upload_vector(L.k_norm);
    }
    if (c.post_norms) {
      D.post_attn_norm = upload_vector(L.post_attn_norm);
      D.post_ffn_norm = upload_vector(L.post_ffn_norm);
    }
  }
}

DeviceForward::~DeviceForward() {
  try {
    be_.sync();    // recorded ops finish before their buffers go
  } catch (...) {  // NOTE: a lost device has nobody left to tell; the buffers are freed anyway
  }
}

DeviceForward::DevWeight DeviceForward::upload_weight(const Weight& w, const std::string& name) {
  DevWeight d;
  d.type = w.type;
  d.rows = w.rows;
  d.cols = w.cols;
  const size_t bytes = w.row_bytes * static_cast<size_t>(w.rows);
  if (w.data == nullptr || bytes == 0) throw std::invalid_argument("DeviceForward: weight " + name + " is empty");
  if (w.tiles) throw std::logic_error("DeviceForward: weight " + name + " is packed as CPU tiles; load it in rows");
  d.buf = be_.alloc(bytes);
  be_.upload(*d.buf, w.data, bytes);
  weight_bytes_ += bytes;
  return d;
}

DeviceForward::DevExperts DeviceForward::upload_experts(const Weight& stacked, int n_expert, const std::string& name) {
  if (stacked.data == nullptr || n_expert <= 0 || stacked.rows % n_expert != 0) {
    throw std::invalid_argument("DeviceForward: expert tensor " + name + " is empty or not " +
                                std::to_string(n_expert) + " experts");
  }
  DevExperts d;
  d.type = stacked.type;
  d.rows = stacked.rows / n_expert;
  d.cols = stacked.cols;
  const size_t bytes = stacked.row_bytes * static_cast<size_t>(d.rows);
  d.stride = (bytes + kBufferViewAlign - 1) / kBufferViewAlign * kBufferViewAlign;
  const size_t total = d.stride * static_cast<size_t>(n_expert);
  d.buf = be_.alloc(total);
  if (d.stride == bytes) {
    be_.upload(*d.buf, stacked.data, total);  // the file's layout is already aligned
  } else {
    std::vector<uint8_t> image(total, 0);  // expert e's bytes at e * stride, zeros between
    for (int e = 0; e < n_expert; ++e) {
      std::copy_n(stacked.data + static_cast<size_t>(e) * bytes, bytes,
                  image.data() + static_cast<size_t>(e) * d.stride);
    }
    be_.upload(*d.buf, image.data(), total);
  }
  weight_bytes_ += total;
  return d;
}

std::unique_ptr<Buffer> DeviceForward::upload_vector(const std::vector<float>& v) {
  auto b = be_.alloc(sizeof(float) * v.size());
  be_.upload(*b, v.data(), sizeof(float) * v.size());
  weight_bytes_ += sizeof(float) * v.size();
  return b;
}

void DeviceForward::fit(std::unique_ptr<Buffer>& b, size_t bytes) {
  if (!b || b->bytes() < bytes) {
    if (b) be_.sync();  // no recorded op may still use the old buffer
    b.reset();          // free it before taking the new one
    b = be_.alloc(std::max<size_t>(bytes, 4));
  }
}

void DeviceForward::reserve(DevPool& p, const KvPool& pool) {
  const size_t need = pool.blocks_allocated(), bb = pool.block_bytes();
  if (need <= p.blocks || bb == 0) return;
  // Double (fewer copies as a pool fills), but never past the budget's blocks.
  size_t blocks = std::max({need, 2 * p.blocks, kFirstPoolBlocks});
  if (pool.budget_bytes() != 0) blocks = std::max(need, std::min(blocks, pool.budget_bytes() / bb));
  auto grown = be_.alloc(blocks * bb);
  if (p.buf && p.blocks > 0) {
    be_.copy(*p.buf, 0, *grown, 0, p.blocks * bb);
    be_.sync();  // the copy (and every op on the old buffer) finishes before it goes
  }
  p.buf = std::move(grown);
  p.blocks = blocks;
}

void DeviceForward::matmul(const DevWeight& w, const Buffer& x, int T, Buffer& y) {
  be_.matmul(w.type, *w.buf, w.rows, w.cols, x, T, y);
}

uint8_t* DeviceForward::host_block(const KvPool& pool, bool swa, int block) {
  DevPool& p = swa ? swa_pool_ : pool_;
  reserve(p, pool);
  if (block < 0 || static_cast<size_t>(block) >= p.blocks) {
    throw std::invalid_argument("DeviceForward::host_block: block " + std::to_string(block) + " is not in the pool");
  }
  auto [it, fresh] = host_blocks_.try_emplace({swa, block});
  if (fresh) {
    it->second.resize(pool.block_bytes());
    be_.download(*p.buf, it->second.data(), pool.block_bytes(), static_cast<size_t>(block) * pool.block_bytes());
  }
  return it->second.data();
}

void DeviceForward::flush_blocks() {
  for (auto& [key, bytes] : host_blocks_) {
    DevPool& p = key.first ? swa_pool_ : pool_;
    be_.upload(*p.buf, bytes.data(), bytes.size(), static_cast<size_t>(key.second) * bytes.size());
  }
  host_blocks_.clear();
}

int DeviceForward::moe_rows_cap(int T) const {
  const ModelConfig& c = model_.config();
  return T * c.n_expert_used + c.n_expert * (moe_row_align_ - 1);
}

void DeviceForward::moe_ffn(const DevLayer& L, int T) {
  const ModelConfig& c = model_.config();
  const int E = c.n_expert, K = c.n_expert_used, d = c.n_embd, F = c.n_ff_exp;
  const size_t st = static_cast<size_t>(T), f4 = sizeof(float);
  // Router on the device, its choice on the host (model.cpp's rule, so both engines pick alike).
  matmul(L.router, *xn_, T, *router_);
  std::vector<float> router(st * E);
  be_.download(*router_, router.data(), router.size() * f4);
  std::vector<int32_t> choice(st * K), idx(st * K);
  std::vector<float> weight(st * K);
  std::vector<int> count(E, 0);
  for (int t = 0; t < T; ++t) {
    moe_route(router.data() + static_cast<size_t>(t) * E, E, K, choice.data() + static_cast<size_t>(t) * K,
              weight.data() + static_cast<size_t>(t) * K);
    for (int k = 0; k < K; ++k) ++count[choice[static_cast<size_t>(t) * K + k]];
  }
  // Expert e's rows: [first[e], first[e] + count[e]) of the grouped buffers, first[e] a multiple of
  // moe_row_align_ so its byte offsets are views; tokens in order inside a group.
  std::vector<int> first(E, 0);
  int rows = 0;
  for (int e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    first[e] = (rows + moe_row_align_ - 1) / moe_row_align_ * moe_row_align_;
    rows = first[e] + count[e];
  }
  std::vector<int32_t> src(rows, -1);  // -1: a padding row (gathered as zeros)
  {
    std::vector<int> fill(first);
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) {
        const int row = fill[choice[static_cast<size_t>(t) * K + k]]++;
        src[row] = t;
        idx[static_cast<size_t>(t) * K + k] = row;
      }
    }
  }
  be_.upload(*moe_src_, src.data(), src.size() * sizeof(int32_t));
  be_.upload(*moe_idx_, idx.data(), idx.size() * sizeof(int32_t));
  be_.upload(*moe_w_, weight.data(), weight.size() * f4);
  be_.gather_rows(*xn_, T, d, *moe_src_, rows, *moe_in_);
  // Each expert's matmuls run once over all its rows (its weights read once per step).
  auto at = [](int row, int width) { return static_cast<size_t>(row) * width * sizeof(float); };
  for (int e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    for (const auto& [w, out] :
         {std::pair<const DevExperts*, Buffer*>{&L.gate_exps, moe_g_.get()}, {&L.up_exps, moe_u_.get()}}) {
      be_.matmul_view(w->type, *w->buf, e * w->stride, F, d, *moe_in_, at(first[e], d), count[e], *out,
                      at(first[e], F));
    }
  }
  be_.gated(GateAct::kSilu, *moe_g_, *moe_u_, static_cast<int64_t>(rows) * F, *moe_h_);
  for (int e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    const DevExperts& w = L.down_exps;
    be_.matmul_view(w.type, *w.buf, e * w.stride, d, F, *moe_h_, at(first[e], F), count[e], *moe_out_, at(first[e], d));
  }
  // y (T, d) = each token's choices, best first, weighted.
  be_.combine_rows(*moe_out_, rows, d, *moe_idx_, *moe_w_, T, K, *y_);
}

size_t DeviceForward::scratch_bytes() const {
  size_t n = 0;
  for (const auto* b : {&router_, &moe_in_, &moe_out_, &moe_g_, &moe_u_, &moe_h_, &moe_src_, &moe_idx_, &moe_w_}) {
    if (*b) n += (*b)->bytes();
  }
  for (const auto* b : {&x_, &xn_, &y_,    &q_,        &qn_,     &attn_,       &k_,  &kn_,     &v_,         &g_,
                        &u_, &h_,  &rows_, &swa_rows_, &tables_, &swa_tables_, &cs_, &swa_cs_, &logits_in_, &logits_}) {
    if (*b) n += (*b)->bytes();
  }
  return n;
}

size_t DeviceForward::pool_bytes() const {
  return (pool_.buf ? pool_.buf->bytes() : 0) + (swa_pool_.buf ? swa_pool_.buf->bytes() : 0);
}

void DeviceForward::forward(const std::vector<BatchItem>& items, const KvPool& kv, const KvPool* swa_kv,
                            std::vector<float>& logits) {
  const ModelConfig& c = model_.config();
  if (c.n_layer_swa > 0 && swa_kv == nullptr) {
    throw std::invalid_argument("DeviceForward::forward: this model has sliding-window layers and needs their KV pool");
  }
  if (swa_kv != nullptr && swa_kv->geometry().block_tokens != kv.geometry().block_tokens) {
    throw std::invalid_argument("DeviceForward::forward: the two KV pools must share block_tokens");
  }
  if (!host_blocks_.empty()) flush_blocks();
  const int bt = kv.geometry().block_tokens, W = c.sliding_window;
  int T = 0, R = 0;
  for (const auto& it : items) {
    T += it.n;
    R += it.n - it.logits_from;
    if (c.n_layer_swa > 0 && it.swa_blocks == nullptr) {
      throw std::invalid_argument("DeviceForward::forward: a batch item lacks its sliding-window block table");
    }
  }
  logits.resize(static_cast<size_t>(R) * c.n_vocab);
  if (T == 0) return;
  reserve(pool_, kv);
  if (swa_kv != nullptr) reserve(swa_pool_, *swa_kv);

  const int d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const int ff = c.n_expert > 0 ? 0 : c.n_ff;  // a MoE's feed_forward_length is no layer's width
  const size_t st = static_cast<size_t>(T), f4 = sizeof(float);
  if (T > cap_T_) {
    for (auto* b : {&x_, &xn_, &y_, &logits_in_}) fit(*b, st * d * f4);
    for (auto* b : {&q_, &qn_, &attn_}) fit(*b, st * q_dim * f4);
    for (auto* b : {&k_, &kn_, &v_}) fit(*b, st * kv_dim * f4);
    for (auto* b : {&g_, &u_, &h_}) fit(*b, st * ff * f4);
    for (auto* b : {&rows_, &swa_rows_}) fit(*b, st * 2 * sizeof(int32_t));
    for (auto* b : {&cs_, &swa_cs_}) fit(*b, st * hd * f4);
    if (c.n_expert > 0) {
      const size_t rp = static_cast<size_t>(moe_rows_cap(T));
      fit(router_, st * c.n_expert * f4);
      for (auto* b : {&moe_in_, &moe_out_}) fit(*b, rp * d * f4);
      for (auto* b : {&moe_g_, &moe_u_, &moe_h_}) fit(*b, rp * c.n_ff_exp * f4);
      fit(moe_src_, rp * sizeof(int32_t));
      fit(moe_idx_, st * c.n_expert_used * sizeof(int32_t));
      fit(moe_w_, st * c.n_expert_used * f4);
    }
    cap_T_ = T;
  }

  // Host: token embeddings, rows (position, first table entry), block tables, RoPE tables.
  std::vector<float> x(st * d);
  std::vector<int32_t> pos(st), rows(st * 2), swa_rows(st * 2), tables, swa_tables;
  const Weight& emb = model_.tok_embd();
  auto check_entries = [&](const std::vector<int>& table, int from, int to, const KvPool& pool, const char* which) {
    // Entries [from, to) are read by this step's rows: each must be a block of the pool.
    for (int b = from; b < to; ++b) {
      if (b >= static_cast<int>(table.size()) || table[b] < 0 ||
          static_cast<size_t>(table[b]) >= pool.blocks_allocated()) {
        throw std::logic_error(std::string("DeviceForward::forward: the ") + which + " block table lacks block " +
                               std::to_string(b) + " (entry outside the pool)");
      }
    }
  };
  {
    int t = 0;
    for (const auto& it : items) {
      const int end = it.pos0 + it.n, n_entries = (end + bt - 1) / bt;
      check_entries(*it.blocks, 0, n_entries, kv, "global");
      const int first = static_cast<int>(tables.size());
      tables.insert(tables.end(), it.blocks->begin(), it.blocks->begin() + n_entries);
      int swa_first = 0;
      if (swa_kv != nullptr) {
        check_entries(*it.swa_blocks, std::max(0, it.pos0 + 1 - W) / bt, n_entries, *swa_kv, "sliding-window");
        swa_first = static_cast<int>(swa_tables.size());
        swa_tables.insert(swa_tables.end(), it.swa_blocks->begin(), it.swa_blocks->begin() + n_entries);
      }
      for (int j = 0; j < it.n; ++j, ++t) {
        const int32_t tok = it.tokens[j];
        if (tok < 0 || tok >= c.n_vocab) throw std::invalid_argument("DeviceForward::forward: token out of range");
        float* xr = x.data() + static_cast<size_t>(t) * d;
        kern_.dequant_row(emb.type, emb.row(tok), xr, d);
        if (c.embd_scale != 1.0f) {
          for (int i = 0; i < d; ++i) xr[i] *= c.embd_scale;
        }
        pos[t] = it.pos0 + j;
        rows[2 * t] = swa_rows[2 * t] = pos[t];
        rows[2 * t + 1] = first;
        swa_rows[2 * t + 1] = swa_first;
      }
    }
  }
  std::vector<float> cs, swa_cs;
  rope_table_host(pos, hd, c.rope_base, model_.rope_freqs(), cs);
  be_.upload(*x_, x.data(), x.size() * f4);
  be_.upload(*rows_, rows.data(), rows.size() * sizeof(int32_t));
  be_.upload(*cs_, cs.data(), cs.size() * f4);
  fit(tables_, tables.size() * sizeof(int32_t));
  be_.upload(*tables_, tables.data(), tables.size() * sizeof(int32_t));
  if (swa_kv != nullptr) {
    rope_table_host(pos, hd, c.rope_base_swa, model_.rope_freqs(), swa_cs);
    be_.upload(*swa_rows_, swa_rows.data(), swa_rows.size() * sizeof(int32_t));
    be_.upload(*swa_cs_, swa_cs.data(), swa_cs.size() * f4);
    fit(swa_tables_, swa_tables.size() * sizeof(int32_t));
    be_.upload(*swa_tables_, swa_tables.data(), swa_tables.size() * sizeof(int32_t));
  }

  const RopePairs pairs = c.rope_style == RopeStyle::kAdjacent ? RopePairs::kAdjacent : RopePairs::kHalfSplit;
  const GateAct act = c.ffn_act == FfnAct::kGeluTanh ? GateAct::kGeluTanh : GateAct::kSilu;
  for (int l = 0; l < c.n_layer; ++l) {
    const DevLayer& L = layers_[l];
    const bool swa = c.layer_swa[l] != 0;
    const KvPool& P = swa ? *swa_kv : kv;
    Buffer& pool_buf = *(swa ? swa_pool_ : pool_).buf;
    const Buffer& tb = swa ? *swa_tables_ : *tables_;
    const Buffer& rb = swa ? *swa_rows_ : *rows_;
    const int kl = c.layer_kv_index[l];

    // Attention block: xn = norm(x); q, k, v; biases; Q/K norms; RoPE; K/V into the pool; attention.
    be_.rms_norm(*x_, *L.attn_norm, T, d, c.rms_eps, *xn_);
    matmul(L.wq, *xn_, T, *q_);
    matmul(L.wk, *xn_, T, *k_);
    matmul(L.wv, *xn_, T, *v_);
    if (c.qkv_bias) {
      be_.add(*q_, *L.bq, st * q_dim, q_dim);
      be_.add(*k_, *L.bk, st * kv_dim, kv_dim);
      be_.add(*v_, *L.bv, st * kv_dim, kv_dim);
    }
    Buffer* qb = q_.get();
    Buffer* kb = k_.get();
    if (c.qk_norm) {
      be_.rms_norm(*q_, *L.q_norm, T * c.n_head, hd, c.rms_eps, *qn_);
      be_.rms_norm(*k_, *L.k_norm, T * c.n_head_kv, hd, c.rms_eps, *kn_);
      qb = qn_.get();
      kb = kn_.get();
    }
    const Buffer& csb = swa ? *swa_cs_ : *cs_;
    be_.rope_table(*qb, csb, T, c.n_head, hd, hd, pairs);
    be_.rope_table(*kb, csb, T, c.n_head_kv, hd, hd, pairs);
    RowTable rt;
    rt.T = T;
    rt.block_tokens = bt;
    rt.block_bytes = P.block_bytes();
    const KvGeometry& g = P.geometry();
    be_.kv_store(g.k_format, *kb, c.n_head_kv, hd, P.k_part_offset(kl), rt, pool_buf, tb, rb);
    be_.kv_store(g.v_format, *v_, c.n_head_kv, hd, P.v_part_offset(kl), rt, pool_buf, tb, rb);
    AttentionShape s;
    s.T = T;
    s.n_head = c.n_head;
    s.n_head_kv = c.n_head_kv;
    s.head_dim = hd;
    s.block_tokens = bt;
    s.n_past = T;
    s.scale = c.attn_scale;
    s.block_bytes = P.block_bytes();
    s.k_offset = P.k_part_offset(kl);
    s.v_offset = P.v_part_offset(kl);
    s.k_format = g.k_format;
    s.v_format = g.v_format;
    s.window = swa ? W : 0;
    be_.attention_rows(s, *qb, pool_buf, tb, rb, *attn_);
    matmul(L.wo, *attn_, T, *y_);
    if (c.post_norms) {
      be_.rms_norm(*y_, *L.post_attn_norm, T, d, c.rms_eps, *xn_);
      be_.add(*x_, *xn_, st * d, st * d);
    } else {
      be_.add(*x_, *y_, st * d, st * d);
    }

    // FFN block: x += down(act(gate(norm(x))) * up(norm(x))), post-normed on gemma3; qwen3moe: the routed
    // experts' mix.
    be_.rms_norm(*x_, *L.ffn_norm, T, d, c.rms_eps, *xn_);
    if (c.n_expert > 0) {
      moe_ffn(L, T);
    } else {
      matmul(L.gate, *xn_, T, *g_);
      matmul(L.up, *xn_, T, *u_);
      be_.gated(act, *g_, *u_, st * ff, *h_);
      matmul(L.down, *h_, T, *y_);
    }
    if (c.post_norms) {
      be_.rms_norm(*y_, *L.post_ffn_norm, T, d, c.rms_eps, *xn_);
      be_.add(*x_, *xn_, st * d, st * d);
    } else {
      be_.add(*x_, *y_, st * d, st * d);
    }
  }
  if (R == 0) {
    be_.sync();  // the step's K/V writes are done when it returns
    return;
  }

  // Final norm of every row, then the rows that need logits gathered into logits_in (R, d).
  be_.rms_norm(*x_, *output_norm_, T, d, c.rms_eps, *xn_);
  const Buffer* head_in = xn_.get();
  if (R != T) {
    int t = 0, r = 0;
    for (const auto& it : items) {
      const int n = it.n - it.logits_from;
      if (n > 0) {
        be_.copy(*xn_, static_cast<size_t>(t + it.logits_from) * d * f4, *logits_in_, static_cast<size_t>(r) * d * f4,
                 static_cast<size_t>(n) * d * f4);
      }
      t += it.n;
      r += n;
    }
    head_in = logits_in_.get();
  }
  fit(logits_, static_cast<size_t>(R) * c.n_vocab * f4);
  matmul(output_, *head_in, R, *logits_);
  be_.download(*logits_, logits.data(), logits.size() * f4);
}

}  // namespace kvs
