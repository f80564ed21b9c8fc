// Decoder-only transformer read from a GGUF file: hyper-parameters and weight
// views for the architectures below, and a forward pass batched over tokens of
// many sequences. Supported `general.architecture` values (kSupportedArchs):
//   llama    RMSNorm, adjacent-pair RoPE (optionally divided by rope_freqs, Llama 3.x), SwiGLU
//   qwen2    llama + Q/K/V biases, half-split RoPE
//   qwen3    llama + per-head RMSNorm of Q and K before RoPE, half-split RoPE, own head_dim
//   qwen3moe qwen3 attention + softmax top-k routed SwiGLU experts (weights renormalised)
//   gemma3   qwen3 attention + sliding-window layers, post-norms, GELU-tanh FFN, sqrt(n_embd) embedding scale
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "kernels/kernels.h"
#include "kv_cache.h"
#include "quant.h"
#include "threadpool.h"

namespace kvs {

// "llama, qwen2, qwen3, qwen3moe, gemma3": for error messages.
extern const char* const kSupportedArchs;

// How RoPE pairs the dims of a head (llama.cpp's NORM and NEOX rope types).
enum class RopeStyle {
  kAdjacent,   // (x[2i], x[2i+1]): llama
  kHalfSplit,  // (x[i], x[i + n_rot/2]): qwen2, qwen3, qwen3moe, gemma3
};

enum class FfnAct {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU with the tanh approximation of GELU (gemma3)
};

struct ModelConfig {
  std::string arch;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;

  // Architecture features (see the header comment).
  RopeStyle rope_style = RopeStyle::kAdjacent;
  FfnAct ffn_act = FfnAct::kSilu;
  bool qkv_bias = false;            // attn_{q,k,v}.bias
  bool qk_norm = false;             // attn_{q,k}_norm (head_dim,) RMSNorm per head before RoPE
  bool post_norms = false;          // post_attention_norm / post_ffw_norm on each branch before its residual add
  bool rope_freqs = false;          // rope_freqs.weight (head_dim/2,) divides each pair's frequency
  float embd_scale = 1.0f;          // token embeddings are multiplied by this (gemma3: sqrt(n_embd))
  float attn_scale = 0.0f;          // scores = q.k * attn_scale
  float rope_base_swa = 10000.0f;   // RoPE base of the sliding-window layers
  int sliding_window = 0;           // W: a sliding layer's token at p attends to (p - W, p]; 0: none
  std::vector<uint8_t> layer_swa;   // (n_layer,) 1: sliding-window layer
  std::vector<int> layer_kv_index;  // (n_layer,) the layer's index inside its KV pool (global or sliding)
  int n_layer_swa = 0;              // layers with a sliding window
  // Mixture of experts (qwen3moe); n_expert == 0: dense FFN.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;  // hidden size of one expert
};

// A 2-D weight: rows of `cols` elements (GGUF ne0 = cols, ne1 = rows).
struct Weight {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;
  // Packed as weight tiles (quant.h): rows / 16 tiles of 16 rows, read with tile() and
  // weight_tile_get_row; row() is then not a row.
  bool tiles = false;
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  const uint8_t* tile(int64_t i) const { return data + static_cast<size_t>(i) * kWeightTileRows * row_bytes; }
};

struct LayerWeights {
  std::vector<float> attn_norm;       // (n_embd,)
  Weight wq;                          // (n_head*head_dim, n_embd)
  Weight wk;                          // (n_head_kv*head_dim, n_embd)
  Weight wv;                          // (n_head_kv*head_dim, n_embd)
  Weight wo;                          // (n_embd, n_head*head_dim)
  std::vector<float> bq, bk, bv;      // qkv_bias: (n_head*head_dim,), (n_head_kv*head_dim,) x2
  std::vector<float> q_norm, k_norm;  // qk_norm: (head_dim,)
  std::vector<float> post_attn_norm;  // post_norms: (n_embd,)
  std::vector<float> post_ffn_norm;   // post_norms: (n_embd,)
  std::vector<float> ffn_norm;        // (n_embd,)
  Weight gate;                        // (n_ff, n_embd)
  Weight up;                          // (n_ff, n_embd)
  Weight down;                        // (n_embd, n_ff)
  Weight router;                      // MoE: (n_expert, n_embd)
  Weight gate_exps;                   // MoE: (n_expert * n_ff_exp, n_embd), expert e's rows [e*n_ff_exp, ...)
  Weight up_exps;                     // MoE: (n_expert * n_ff_exp, n_embd)
  Weight down_exps;                   // MoE: (n_expert * n_embd, n_ff_exp)
};

// One run of consecutive tokens of one sequence in a forward batch.
struct BatchItem {
  const int32_t* tokens = nullptr;  // (n,)
  int n = 0;
  int pos0 = 0;                              // position of tokens[0]
  const std::vector<int>* blocks = nullptr;  // the sequence's block table, covering pos0+n
  // Block table of the sliding-window layers (models with sliding layers only):
  // indexed by position / block_tokens like `blocks`, -1 where a block before
  // the window was released; covers [pos0 + 1 - W, pos0 + n) clipped at 0.
  const std::vector<int>* swa_blocks = nullptr;
  int logits_from = 0;  // logits are produced for tokens[logits_from..n)
};

// One attention task: positions [begin, end) of token row t for kv head kh.
struct AttnTask {
  int t, kh, begin, end;
};

// Scratch buffers reused across steps; grown on demand.
// Sizes a scratch buffer to n elements (contents are not kept). It grows to
// exactly n, not to std::vector's doubling, so the engine's scratch bytes are a
// function of the largest step it has run, which the planner computes.
template <class T>
void fit(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) {
    std::vector<T>().swap(v);
    v.reserve(n);
  }
  v.resize(n);
}

// Where forward passes spend their time and what they read, summed since the
// last reset (Engine::set_timers / Engine::timers). With `on` false the forward
// pass only tests the flag. Times are wall-clock seconds on the calling thread
// (each part spans its parallel loops); other = total - weights - attention
// (norms, RoPE and the K/V writes, activations, embedding, sampling).
struct StepTimers {
  bool on = false;
  int64_t steps = 0;          // timed engine steps (Engine::step calls and score chunks that ran the model)
  int64_t tokens = 0;         // token rows through the forward passes
  double total_s = 0.0;       // whole steps, forward and sampling
  double weights_s = 0.0;     // matmuls (every weight matrix, the output projection included)
  double attention_s = 0.0;   // scores, softmax and the weighted V sums, merges included
  uint64_t weight_bytes = 0;  // weight rows the matmuls streamed, plus the embedding rows looked up
  uint64_t kv_bytes = 0;      // K and V rows attention read (every layer, kv head and position)
  void reset() { *this = StepTimers{on}; }
};

// Adds the wall time of its scope to *acc; does nothing when acc is null (timers off).
class ScopeTimer {
 public:
  explicit ScopeTimer(double* acc) : acc_(acc) {
    if (acc_ != nullptr) t0_ = std::chrono::steady_clock::now();
  }
  ~ScopeTimer() {
    if (acc_ != nullptr) *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopeTimer(const ScopeTimer&) = delete;
  ScopeTimer& operator=(const ScopeTimer&) = delete;

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_{};
};

struct Workspace {
  StepTimers timers;
  // false: quantized weights multiply 8-bit activation blocks with integer dot
  // products (fast); true: every weight row is dequantized and dotted in float32
  // (slower, free of activation rounding; for quality measurements).
  bool float_activations = false;
  std::vector<BlockQ8A> xq;  // (T, cols/32) quantized matmul input
  std::vector<AttnTask> attn_tasks;
  std::vector<int> attn_first;  // (T*n_kv + 1,) first task of each (token, kv head)
  std::vector<int> attn_merge;  // the (token, kv head) pairs whose context spans several tasks
  std::vector<float> partials;  // (tasks, G*(hd+2)) partial softmax state
  std::vector<float> x, xn, q, k, v, attn, ff_gate, ff_up, logits_in;
  // MoE: router probabilities and the rows routed to the experts, grouped by expert.
  std::vector<float> moe_probs;                          // (T, n_expert)
  std::vector<int> moe_choice;                           // (T, n_expert_used) chosen experts, best first
  std::vector<float> moe_weight;                         // (T, n_expert_used) renormalised routing weights
  std::vector<int> moe_row;                              // (T, n_expert_used) row of each choice in moe_in
  std::vector<int> moe_first;                            // (n_expert + 1,) first row of each expert in moe_in
  std::vector<float> moe_in, moe_gate, moe_up, moe_out;  // (T*n_expert_used, n_embd / n_ff_exp / n_ff_exp / n_embd)
  std::vector<int32_t> row_pos;                          // (T,)
  std::vector<const std::vector<int>*> row_blocks;       // (T,)
  std::vector<const std::vector<int>*> row_swa_blocks;   // (T,)
  std::vector<std::vector<float>> thread_scratch;        // per thread
};

// The qwen3moe router's rule, shared by Model::moe_ffn and the device forward (device_forward.cpp):
// router logits (E,) -> softmax -> the K most probable experts (ties: lower id), best first, into
// choice (K,), their probabilities renormalised to sum 1 into weight (K,). Sums in double.
void moe_route(const float* logits, int E, int K, int32_t* choice, float* weight);

class Model {
 public:
  // tiles_for: the kernels the forward will run; where the weights are a private copy (Residency::kHugePages
  // granted), the matrices of the types those kernels have a weight-tile body for (Kernels::weight_tile_types)
  // whose rows are a multiple of 16 are packed as weight tiles in place (quant.h).
  explicit Model(const std::string& path, Residency residency = Residency::kMapped, const Kernels* tiles_for = nullptr);

  const ModelConfig& config() const { return cfg_; }
  const GgufFile& file() const { return *file_; }
  // Bytes of every weight read by one decode step (the shared weight stream).
  size_t weight_bytes() const { return weight_bytes_; }
  // Bytes of the weights packed as tiles (0: every weight in rows).
  size_t tile_bytes() const { return tile_bytes_; }
  // The weights, for forwards that run elsewhere (device_forward.cpp uploads them to a device).
  const Weight& tok_embd() const { return tok_embd_; }
  const Weight& output() const { return output_; }  // tok_embd() when tied
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }  // empty: none
  const std::vector<LayerWeights>& layers() const { return layers_; }

  // Runs items through the model, writing their K/V into the pool and returning
  // logits rows in item order: for each item, n - logits_from rows of n_vocab.
  // logits: (sum over items of (n - logits_from), n_vocab)
  // kv holds the global (full-context) layers; swa_kv the sliding-window layers
  // (required when config().n_layer_swa > 0, else unused).
  void forward(const std::vector<BatchItem>& items, KvPool& kv, KvPool* swa_kv, ThreadPool& pool, const Kernels& kern,
               Workspace& ws, std::vector<float>& logits) const;
  void forward(const std::vector<BatchItem>& items, KvPool& kv, ThreadPool& pool, const Kernels& kern, Workspace& ws,
               std::vector<float>& logits) const {
    forward(items, kv, nullptr, pool, kern, ws, logits);
  }

 private:
  Weight load_weight(const std::string& name, int64_t rows, int64_t cols) const;
  std::vector<float> load_vector(const std::string& name, int64_t n) const;
  // A 3-D tensor [cols, rows, n_mat] viewed as (n_mat * rows, cols).
  Weight load_stacked(const std::string& name, int64_t n_mat, int64_t rows, int64_t cols) const;
  void read_config();
  void moe_ffn(const LayerWeights& L, int T, ThreadPool& pool, const Kernels& kern, Workspace& ws) const;
  void pack_tiles(uint64_t types);

  std::unique_ptr<GgufFile> file_;
  ModelConfig cfg_;
  Weight tok_embd_;  // (n_vocab, n_embd)
  Weight output_;    // (n_vocab, n_embd); tok_embd_ when tied
  std::vector<float> output_norm_;
  std::vector<float> rope_freqs_;  // (head_dim/2,) frequency divisors; empty: none
  std::vector<LayerWeights> layers_;
  size_t weight_bytes_ = 0;
  size_t tile_bytes_ = 0;
};

}  // namespace kvs
