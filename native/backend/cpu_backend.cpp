// The CPU backend: host buffers and the active kernel table (kernels/).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernels.h"
#include "backend.h"

namespace kvs {
namespace {

class HostBuffer : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : data_(bytes) {}
  size_t bytes() const override { return data_.size(); }
  uint8_t* data() { return data_.data(); }
  const uint8_t* data() const { return data_.data(); }

 private:
  std::vector<uint8_t> data_;
};

const HostBuffer& host(const Buffer& b) {
  const auto* h = dynamic_cast<const HostBuffer*>(&b);
  if (h == nullptr) throw std::invalid_argument("cpu backend: buffer belongs to another backend");
  return *h;
}
HostBuffer& host(Buffer& b) {
  return const_cast<HostBuffer&>(host(static_cast<const Buffer&>(b)));
}

void need(const Buffer& b, size_t bytes, const char* what) {
  if (b.bytes() < bytes) {
    throw std::invalid_argument(std::string("cpu backend: ") + what + " holds " + std::to_string(b.bytes()) +
                                " bytes, the op needs " + std::to_string(bytes));
  }
}

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(bool float_activations) : k_(active_kernels()), float_activations_(float_activations) {}
  std::string name() const override { return "cpu"; }
  const char* dot_path() const override { return float_activations_ ? "float" : "integer dot"; }  // matmul only

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
  void upload(Buffer& buf, const void* src, size_t bytes, size_t offset) override {
    if (offset > buf.bytes() || bytes > buf.bytes() - offset) throw std::invalid_argument("cpu upload: out of range");
    std::memcpy(host(buf).data() + offset, src, bytes);
  }
  void download(const Buffer& buf, void* dst, size_t bytes, size_t offset) override {
    if (offset > buf.bytes() || bytes > buf.bytes() - offset) throw std::invalid_argument("cpu download: out of range");
    std::memcpy(dst, host(buf).data() + offset, bytes);
  }

  void matmul(GgmlType type, const Buffer& w, int64_t rows, int64_t cols, const Buffer& x, int T, Buffer& y) override {
    const size_t rb = row_bytes(type, cols);
    need(w, rb * rows, "weights");
    need(x, sizeof(float) * T * cols, "x");
    need(y, sizeof(float) * T * rows, "y");
    const uint8_t* W = host(w).data();
    const auto* X = reinterpret_cast<const float*>(host(x).data());
    auto* Y = reinterpret_cast<float*>(host(y).data());
    matmul_rows(type, W, rb, rows, cols, X, T, Y);
  }

  void rms_norm(const Buffer& x, const Buffer& w, int T, int n, float eps, Buffer& y) override {
    need(x, sizeof(float) * T * n, "x");
    need(w, sizeof(float) * n, "w");
    need(y, sizeof(float) * T * n, "y");
    const auto* X = reinterpret_cast<const float*>(host(x).data());
    const auto* Wt = reinterpret_cast<const float*>(host(w).data());
    auto* Y = reinterpret_cast<float*>(host(y).data());
    for (int t = 0; t < T; ++t) {
      double ss = 0.0;
      for (int i = 0; i < n; ++i) ss += static_cast<double>(X[t * n + i]) * X[t * n + i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
      for (int i = 0; i < n; ++i) Y[t * n + i] = X[t * n + i] * inv * Wt[i];
    }
  }

  void rope(Buffer& x, const Buffer& pos, int T, int n_head, int head_dim, int n_rot, float base,
            RopePairs style) override {
    need(x, sizeof(float) * T * n_head * head_dim, "x");
    need(pos, sizeof(int32_t) * T, "pos");
    auto* X = reinterpret_cast<float*>(host(x).data());
    const auto* P = reinterpret_cast<const int32_t*>(host(pos).data());
    const int half = n_rot / 2;
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < half; ++i) {
        const double theta = P[t] * std::pow(static_cast<double>(base), -2.0 * i / n_rot);
        const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
        for (int h = 0; h < n_head; ++h) {
          float* xh = X + (static_cast<size_t>(t) * n_head + h) * head_dim;
          const int ia = style == RopePairs::kAdjacent ? 2 * i : i;
          const int ib = style == RopePairs::kAdjacent ? 2 * i + 1 : i + half;
          const float a = xh[ia], b = xh[ib];
          xh[ia] = a * c - b * s;
          xh[ib] = a * s + b * c;
        }
      }
    }
  }

  void gated(GateAct act, const Buffer& g, const Buffer& u, int64_t n, Buffer& out) override {
    need(g, sizeof(float) * n, "g");
    need(u, sizeof(float) * n, "u");
    need(out, sizeof(float) * n, "out");
    const auto* G = reinterpret_cast<const float*>(host(g).data());
    const auto* U = reinterpret_cast<const float*>(host(u).data());
    auto* O = reinterpret_cast<float*>(host(out).data());
    constexpr float kSqrt2OverPi = 0.7978845608028654f;  // GELU tanh approximation constants
    constexpr float kCubic = 0.044715f;
    for (int64_t i = 0; i < n; ++i) {
      const float v = G[i];
      O[i] = act == GateAct::kSilu ? v / (1.0f + std::exp(-v)) * U[i]
                                   : 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * v * (1.0f + kCubic * v * v))) * U[i];
    }
  }

  void attention(const AttentionShape& s, const Buffer& q, const Buffer& pool, const Buffer& blocks,
                 Buffer& out) override {
    check_attention_shape(s, pool, "cpu attention");
    const int hd = s.head_dim, nb = (s.n_past + s.block_tokens - 1) / s.block_tokens;
    const size_t krb = kv_row_bytes(s.k_format, hd), vrb = kv_row_bytes(s.v_format, hd);
    need(q, sizeof(float) * s.T * s.n_head * hd, "q");
    need(out, sizeof(float) * s.T * s.n_head * hd, "out");
    need(blocks, sizeof(int32_t) * nb, "blocks");
    const auto* Q = reinterpret_cast<const float*>(host(q).data());
    const auto* B = reinterpret_cast<const int32_t*>(host(blocks).data());
    auto* O = reinterpret_cast<float*>(host(out).data());
    const uint8_t* P = host(pool).data();
    check_block_table(B, nb, s, pool, "cpu attention");
    const int group = s.n_head / s.n_head_kv;
    auto row = [&](int pos, int hk, size_t part, size_t rb) {
      return P + B[pos / s.block_tokens] * s.block_bytes + part +
             (static_cast<size_t>(hk) * s.block_tokens + pos % s.block_tokens) * rb;
    };
    std::vector<float> kr(hd), vr(hd), sc(s.n_past);
    for (int t = 0; t < s.T; ++t) {
      const int visible = s.n_past - s.T + t + 1;
      for (int h = 0; h < s.n_head; ++h) {
        const int hk = h / group;
        const float* qh = Q + (static_cast<size_t>(t) * s.n_head + h) * hd;
        float mx = -INFINITY;
        for (int j = 0; j < visible; ++j) {
          k_.kv_load_row(s.k_format, row(j, hk, s.k_offset, krb), kr.data(), hd);
          sc[j] = k_.dot_f32(qh, kr.data(), hd) * s.scale;
          mx = std::max(mx, sc[j]);
        }
        const float sum = k_.exp_sum(sc.data(), visible, mx);
        float* oh = O + (static_cast<size_t>(t) * s.n_head + h) * hd;
        std::fill(oh, oh + hd, 0.0f);
        for (int j = 0; j < visible; ++j) {
          k_.kv_load_row(s.v_format, row(j, hk, s.v_offset, vrb), vr.data(), hd);
          k_.axpy_f32(sc[j] / sum, vr.data(), oh, hd);
        }
      }
    }
  }

  void sync() override {}

  bool has_matmul(GgmlType type) const override { return type_supported(static_cast<uint32_t>(type)); }

  void copy(const Buffer& src, size_t src_offset, Buffer& dst, size_t dst_offset, size_t bytes) override {
    if (src_offset > src.bytes() || bytes > src.bytes() - src_offset || dst_offset > dst.bytes() ||
        bytes > dst.bytes() - dst_offset) {
      throw std::invalid_argument("cpu copy: range outside a buffer");
    }
    std::memcpy(host(dst).data() + dst_offset, host(src).data() + src_offset, bytes);
  }

  void add(Buffer& y, const Buffer& b, int64_t n, int64_t period) override {
    if (n < 0 || period <= 0) throw std::invalid_argument("cpu add: n must be >= 0 and period > 0");
    need(y, sizeof(float) * n, "y");
    need(b, sizeof(float) * std::min(n, period), "b");
    auto* Y = reinterpret_cast<float*>(host(y).data());
    const auto* B = reinterpret_cast<const float*>(host(b).data());
    for (int64_t i = 0; i < n; ++i) Y[i] += B[i % period];
  }

  void rope_table(Buffer& x, const Buffer& cs, int T, int n_head, int head_dim, int n_rot, RopePairs style) override {
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) throw std::invalid_argument("cpu rope_table: bad n_rot");
    need(x, sizeof(float) * T * n_head * head_dim, "x");
    need(cs, sizeof(float) * T * n_rot, "cs");
    auto* X = reinterpret_cast<float*>(host(x).data());
    const auto* CS = reinterpret_cast<const float*>(host(cs).data());
    const int half = n_rot / 2;
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < n_head; ++h) {
        float* xh = X + (static_cast<size_t>(t) * n_head + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float c = CS[(static_cast<size_t>(t) * half + i) * 2],
                      s = CS[(static_cast<size_t>(t) * half + i) * 2 + 1];
          const int ia = style == RopePairs::kAdjacent ? 2 * i : i;
          const int ib = style == RopePairs::kAdjacent ? 2 * i + 1 : i + half;
          const float a = xh[ia], b = xh[ib];
          xh[ia] = a * c - b * s;
          xh[ib] = a * s + b * c;
        }
      }
    }
  }

  void kv_store(KvFormat format, const Buffer& src, int n_kv_head, int head_dim, size_t part_offset, const RowTable& rt,
                Buffer& pool, const Buffer& tables, const Buffer& rows) override {
    const size_t rb = kv_row_bytes(format, head_dim);
    need(src, sizeof(float) * rt.T * n_kv_head * head_dim, "src");
    need(rows, sizeof(int32_t) * 2 * rt.T, "rows");
    if (part_offset + rb * n_kv_head * rt.block_tokens > rt.block_bytes) {
      throw std::invalid_argument("cpu kv_store: rows run past block_bytes");
    }
    const auto* S = reinterpret_cast<const float*>(host(src).data());
    const auto* R = reinterpret_cast<const int32_t*>(host(rows).data());
    const auto* TB = reinterpret_cast<const int32_t*>(host(tables).data());
    const size_t n_entries = tables.bytes() / sizeof(int32_t), n_blocks = pool.bytes() / rt.block_bytes;
    uint8_t* P = host(pool).data();
    for (int t = 0; t < rt.T; ++t) {
      const int pos = R[2 * t];
      const size_t entry = static_cast<size_t>(R[2 * t + 1]) + pos / rt.block_tokens;
      if (pos < 0 || R[2 * t + 1] < 0 || entry >= n_entries || TB[entry] < 0 ||
          static_cast<size_t>(TB[entry]) >= n_blocks) {
        throw std::invalid_argument("cpu kv_store: row " + std::to_string(t) + " has no pool block for position " +
                                    std::to_string(pos));
      }
      for (int h = 0; h < n_kv_head; ++h) {
        uint8_t* dst = P + TB[entry] * rt.block_bytes + part_offset +
                       (static_cast<size_t>(h) * rt.block_tokens + pos % rt.block_tokens) * rb;
        kv_store_row(format, S + (static_cast<size_t>(t) * n_kv_head + h) * head_dim, dst, head_dim);
      }
    }
  }

  void attention_rows(const AttentionShape& s, const Buffer& q, const Buffer& pool, const Buffer& tables,
                      const Buffer& rows, Buffer& out) override {
    AttentionShape one = s;
    one.n_past = s.T;  // check_attention_shape's n_past >= T
    check_attention_shape(one, pool, "cpu attention_rows");
    const int hd = s.head_dim, group = s.n_head / s.n_head_kv;
    const size_t krb = kv_row_bytes(s.k_format, hd), vrb = kv_row_bytes(s.v_format, hd);
    need(q, sizeof(float) * s.T * s.n_head * hd, "q");
    need(out, sizeof(float) * s.T * s.n_head * hd, "out");
    need(rows, sizeof(int32_t) * 2 * s.T, "rows");
    const auto* Q = reinterpret_cast<const float*>(host(q).data());
    const auto* R = reinterpret_cast<const int32_t*>(host(rows).data());
    const auto* TB = reinterpret_cast<const int32_t*>(host(tables).data());
    auto* O = reinterpret_cast<float*>(host(out).data());
    const uint8_t* P = host(pool).data();
    const size_t n_entries = tables.bytes() / sizeof(int32_t), n_blocks = pool.bytes() / s.block_bytes;
    std::vector<float> kr(hd), vr(hd), sc;
    for (int t = 0; t < s.T; ++t) {
      const int pos = R[2 * t], first = R[2 * t + 1];
      const int lo = s.window > 0 ? std::max(0, pos + 1 - s.window) : 0;
      auto row = [&](int p, int hk, size_t part, size_t rb) {
        const size_t entry = static_cast<size_t>(first) + p / s.block_tokens;
        if (entry >= n_entries || TB[entry] < 0 || static_cast<size_t>(TB[entry]) >= n_blocks) {
          throw std::invalid_argument("cpu attention_rows: row " + std::to_string(t) +
                                      " has no pool block for position " + std::to_string(p));
        }
        return P + TB[entry] * s.block_bytes + part +
               (static_cast<size_t>(hk) * s.block_tokens + p % s.block_tokens) * rb;
      };
      sc.resize(pos + 1 - lo);
      for (int h = 0; h < s.n_head; ++h) {
        const int hk = h / group;
        const float* qh = Q + (static_cast<size_t>(t) * s.n_head + h) * hd;
        float mx = -INFINITY;
        for (int j = lo; j <= pos; ++j) {
          k_.kv_load_row(s.k_format, row(j, hk, s.k_offset, krb), kr.data(), hd);
          sc[j - lo] = k_.dot_f32(qh, kr.data(), hd) * s.scale;
          mx = std::max(mx, sc[j - lo]);
        }
        const float sum = k_.exp_sum(sc.data(), pos + 1 - lo, mx);
        float* oh = O + (static_cast<size_t>(t) * s.n_head + h) * hd;
        std::fill(oh, oh + hd, 0.0f);
        for (int j = lo; j <= pos; ++j) {
          k_.kv_load_row(s.v_format, row(j, hk, s.v_offset, vrb), vr.data(), hd);
          k_.axpy_f32(sc[j - lo] / sum, vr.data(), oh, hd);
        }
      }
    }
  }

  void matmul_view(GgmlType type, const Buffer& w, size_t w_offset, int64_t rows, int64_t cols, const Buffer& x,
                   size_t x_offset, int T, Buffer& y, size_t y_offset) override {
    if (rows <= 0 || cols <= 0 || T <= 0) throw std::invalid_argument("cpu matmul_view: rows, cols and T must be > 0");
    const size_t rb = row_bytes(type, cols);
    check_view(w, w_offset, rb * rows, "cpu matmul_view", "weights");
    check_view(x, x_offset, sizeof(float) * T * cols, "cpu matmul_view", "x");
    check_view(y, y_offset, sizeof(float) * T * rows, "cpu matmul_view", "y");
    const uint8_t* W = host(w).data() + w_offset;
    const auto* X = reinterpret_cast<const float*>(host(x).data() + x_offset);
    auto* Y = reinterpret_cast<float*>(host(y).data() + y_offset);
    matmul_rows(type, W, rb, rows, cols, X, T, Y);  // matmul()'s body over the views
  }

  void gather_rows(const Buffer& src, int T, int n, const Buffer& idx, int R, Buffer& dst) override {
    if (T < 0 || n <= 0 || R < 0) throw std::invalid_argument("cpu gather_rows: need T >= 0, n > 0, R >= 0");
    need(src, sizeof(float) * T * n, "src");
    need(idx, sizeof(int32_t) * R, "idx");
    need(dst, sizeof(float) * R * n, "dst");
    const auto* S = reinterpret_cast<const float*>(host(src).data());
    const auto* I = reinterpret_cast<const int32_t*>(host(idx).data());
    auto* D = reinterpret_cast<float*>(host(dst).data());
    for (int r = 0; r < R; ++r) {
      float* d = D + static_cast<size_t>(r) * n;
      if (I[r] >= 0 && I[r] < T) {
        std::memcpy(d, S + static_cast<size_t>(I[r]) * n, sizeof(float) * n);
      } else {
        std::fill(d, d + n, 0.0f);
      }
    }
  }

  void combine_rows(const Buffer& src, int R, int n, const Buffer& idx, const Buffer& weight, int T, int K,
                    Buffer& dst) override {
    if (R < 0 || n <= 0 || T < 0 || K <= 0) throw std::invalid_argument("cpu combine_rows: need R, T >= 0, n, K > 0");
    need(src, sizeof(float) * R * n, "src");
    need(idx, sizeof(int32_t) * T * K, "idx");
    need(weight, sizeof(float) * T * K, "weight");
    need(dst, sizeof(float) * T * n, "dst");
    const auto* S = reinterpret_cast<const float*>(host(src).data());
    const auto* I = reinterpret_cast<const int32_t*>(host(idx).data());
    const auto* Wt = reinterpret_cast<const float*>(host(weight).data());
    auto* D = reinterpret_cast<float*>(host(dst).data());
    for (int t = 0; t < T; ++t) {
      float* d = D + static_cast<size_t>(t) * n;
      std::fill(d, d + n, 0.0f);
      for (int k = 0; k < K; ++k) {
        const int32_t r = I[static_cast<size_t>(t) * K + k];
        if (r < 0 || r >= R) continue;
        const float wk = Wt[static_cast<size_t>(t) * K + k];
        const float* s = S + static_cast<size_t>(r) * n;
        for (int i = 0; i < n; ++i) d[i] += wk * s[i];
      }
    }
  }

 private:
  // matmul()'s and matmul_view()'s body: W (rows, cols), rb bytes a row @ X (T, cols) -> Y (T, rows), each
  // output row computed alone (batch invariant). Shapes are checked by the caller.
  void matmul_rows(GgmlType type, const uint8_t* W, size_t rb, int64_t rows, int64_t cols, const float* X, int T,
                   float* Y) const {
    if (type_is_quantized(type) && !float_activations_) {
      const int64_t nb = cols / kQK;
      std::vector<BlockQ8A> q(static_cast<size_t>(T) * nb);
      for (int t = 0; t < T; ++t) k_.quantize_act(X + t * cols, q.data() + t * nb, cols);
      for (int64_t r = 0; r < rows; ++r) k_.dot_q_batch(type, W + r * rb, q.data(), nb, T, cols, Y + r, rows);
      return;
    }
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      k_.dequant_row(type, W + r * rb, row.data(), cols);
      for (int t = 0; t < T; ++t) Y[t * rows + r] = k_.dot_f32(row.data(), X + t * cols, static_cast<int>(cols));
    }
  }

  const Kernels& k_;
  bool float_activations_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(bool float_activations) {
  return std::make_unique<CpuBackend>(float_activations);
}

}  // namespace kvs
