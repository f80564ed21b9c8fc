// The model's forward over the backend layer (issue 16): the same batched step as Model::forward (decode
// rows and prefill chunks of many sequences), every op a Backend op, so it runs on a GPU through the
// Vulkan backend (or, as the reference, on the CPU backend's ops).
//
// Device state (all Buffers of one Backend):
//   weights    every projection's raw GGUF bytes and every norm/bias vector as f32, uploaded once
//   KV pools   one Buffer per KvPool (global layers, sliding layers): block b at b * block_bytes, the
//              CPU pool's byte layout (kv_cache.h). The KvPool (host_storage false) keeps the block ids,
//              holders, budget and byte accounting; this object keeps the bytes, growing a Buffer (and
//              copying it on the device) when the pool has allocated more blocks than it holds.
//   activations  (T, width) f32 per step, grown to the largest step.
// Host side per step: the embedding gather (token rows dequantized on the host), the RoPE (cos, sin)
// table (the CPU forward's doubles, so angles agree to the bit), the rows' positions and block tables,
// and the logits download; sampling stays with the engine.
// NOTE: each op is sized by the step alone (no op reads another row's data but attention's own KV), so a
// sequence's logits are bit-equal whatever else is in its batch.
// Routed experts (qwen3moe, moe_ffn): the router's matmul on the device, its logits downloaded, softmax and
// top-k on the host (moe_route, model.cpp's rule), the routed rows gathered into expert-grouped rows on the
// device, each expert's matmuls over its rows through views into the stacked expert tensors (expert e at
// byte e * stride, no copy), SwiGLU, and each token's weighted sum of its experts' rows. Each expert's
// group of rows starts at a kBufferViewAlign-aligned byte offset (padding rows between groups).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kernels/kernels.h"
#include "kv_cache.h"
#include "model.h"

namespace kvs {

class DeviceForward {
 public:
  // Uploads the weights. Throws std::invalid_argument naming the architecture (qwen3moe) or the first
  // weight whose format the backend has no matmul for.
  DeviceForward(const Model& model, Backend& backend, const Kernels& kern);
  ~DeviceForward();
  DeviceForward(const DeviceForward&) = delete;
  DeviceForward& operator=(const DeviceForward&) = delete;

  // Model::forward's contract: K/V of the items into the pools' device bytes, logits (sum over items of
  // (n - logits_from), n_vocab) in item order. kv, swa_kv: the engine's pools (host_storage false).
  void forward(const std::vector<BatchItem>& items, const KvPool& kv, const KvPool* swa_kv, std::vector<float>& logits);

  // Host access for KV rows the engine writes itself (fill_kv): a host copy of block `block` of `pool`
  // (downloaded on first use; swa: the sliding pool), valid until flush_blocks(), which uploads them.
  uint8_t* host_block(const KvPool& pool, bool swa, int block);
  void flush_blocks();

  Backend& backend() { return be_; }
  size_t device_weight_bytes() const { return weight_bytes_; }
  // Activations, tables and logits on the device (the host scratch of Model::forward's counterpart).
  size_t scratch_bytes() const;
  // Bytes of the device KV pools (their capacity; the KvPools account for what is in use).
  size_t pool_bytes() const;

 private:
  struct DevWeight {
    GgmlType type = GgmlType::F32;
    int64_t rows = 0, cols = 0;
    std::unique_ptr<Buffer> buf;
  };
  // A stacked expert tensor (n_expert, rows, cols) uploaded with expert e's rows at byte e * stride
  // (stride: the expert's bytes rounded up to kBufferViewAlign, so every expert is a matmul_view).
  struct DevExperts {
    GgmlType type = GgmlType::F32;
    int64_t rows = 0, cols = 0;  // of one expert
    size_t stride = 0;
    std::unique_ptr<Buffer> buf;
  };
  struct DevLayer {
    DevWeight wq, wk, wv, wo, gate, up, down;
    DevWeight router;                          // MoE: (n_expert, n_embd)
    DevExperts gate_exps, up_exps, down_exps;  // MoE: (n_expert, n_ff_exp, n_embd) x2, (n_expert, n_embd, n_ff_exp)
    std::unique_ptr<Buffer> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, post_attn_norm, post_ffn_norm;
  };
  struct DevPool {
    std::unique_ptr<Buffer> buf;
    size_t blocks = 0;  // blocks buf holds
  };

  DevWeight upload_weight(const Weight& w, const std::string& name);
  std::unique_ptr<Buffer> upload_vector(const std::vector<float>& v);
  // Grows p to hold every block `pool` has allocated (copying what it held).
  void reserve(DevPool& p, const KvPool& pool);
  // Sizes b to at least `bytes` (contents are not kept).
  void fit(std::unique_ptr<Buffer>& b, size_t bytes);
  void matmul(const DevWeight& w, const Buffer& x, int T, Buffer& y);
  DevExperts upload_experts(const Weight& stacked, int n_expert, const std::string& name);
  // The MoE FFN of layer L over xn_ (T, n_embd) -> y_ (T, n_embd) (model.cpp's Model::moe_ffn).
  void moe_ffn(const DevLayer& L, int T);
  // Rows of the expert-grouped buffers for a step of T tokens: T * n_expert_used routed rows plus the
  // padding that aligns each expert's group (at most moe_row_align_ - 1 rows per expert).
  int moe_rows_cap(int T) const;

  const Model& model_;
  Backend& be_;
  const Kernels& kern_;
  size_t weight_bytes_ = 0;
  DevWeight output_;
  std::unique_ptr<Buffer> output_norm_;
  std::vector<DevLayer> layers_;
  DevPool pool_, swa_pool_;
  std::map<std::pair<bool, int>, std::vector<uint8_t>> host_blocks_;  // {(swa, block): its bytes}
  // Per-step buffers: x, xn, y (T, n_embd); q, qn, attn (T, q_dim); k, kn, v (T, kv_dim);
  // g, u, h (T, n_ff); rows, swa_rows (T, 2) int32; tables, swa_tables; cs, swa_cs (T, head_dim/2, 2);
  // logits_in (R, n_embd); logits (R, n_vocab).
  std::unique_ptr<Buffer> x_, xn_, y_, q_, qn_, attn_, k_, kn_, v_, g_, u_, h_;
  std::unique_ptr<Buffer> rows_, swa_rows_, tables_, swa_tables_, cs_, swa_cs_, logits_in_, logits_;
  int cap_T_ = 0;  // rows the activation buffers hold
  // MoE per-step buffers: router (T, n_expert) logits; moe_in, moe_out (Rp, n_embd) and moe_g, moe_u,
  // moe_h (Rp, n_ff_exp) expert-grouped rows (Rp = moe_rows_cap(T)); moe_src (Rp,) int32 the token of each
  // grouped row (-1: padding); moe_idx (T, K) int32 the grouped row of each choice, moe_w (T, K) its weight.
  std::unique_ptr<Buffer> router_, moe_in_, moe_out_, moe_g_, moe_u_, moe_h_, moe_src_, moe_idx_, moe_w_;
  int moe_row_align_ = 1;  // rows per kBufferViewAlign bytes of both n_embd and n_ff_exp rows (a power of two)
};

}  // namespace kvs
