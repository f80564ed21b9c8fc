// Llama-family model: hyper-parameters and weight views over a GGUF file, and
// a forward pass batched over tokens of many sequences.
#pragma once

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
};

// A 2-D weight: rows of `cols` elements (GGUF ne0 = cols, ne1 = rows).
struct Weight {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // (n_embd,)
  Weight wq;                     // (n_head*head_dim, n_embd)
  Weight wk;                     // (n_head_kv*head_dim, n_embd)
  Weight wv;                     // (n_head_kv*head_dim, n_embd)
  Weight wo;                     // (n_embd, n_head*head_dim)
  std::vector<float> ffn_norm;   // (n_embd,)
  Weight gate;                   // (n_ff, n_embd)
  Weight up;                     // (n_ff, n_embd)
  Weight down;                   // (n_embd, n_ff)
};

// One run of consecutive tokens of one sequence in a forward batch.
struct BatchItem {
  const int32_t* tokens = nullptr;  // (n,)
  int n = 0;
  int pos0 = 0;                              // position of tokens[0]
  const std::vector<int>* blocks = nullptr;  // the sequence's block table, covering pos0+n
  int logits_from = 0;                       // logits are produced for tokens[logits_from..n)
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

struct Workspace {
  // false: quantized weights multiply 8-bit activation blocks with integer dot
  // products (fast); true: every weight row is dequantized and dotted in float32
  // (slower, free of activation rounding; for quality measurements).
  bool float_activations = false;
  std::vector<BlockQ8A> xq;  // (T, cols/32) quantized matmul input
  std::vector<AttnTask> attn_tasks;
  std::vector<int> attn_first;  // (T*n_kv + 1,) first task of each (token, kv head)
  std::vector<float> partials;  // (tasks, G*(hd+2)) partial softmax state
  std::vector<float> x, xn, q, k, v, attn, ff_gate, ff_up, logits_in;
  std::vector<int32_t> row_pos;                     // (T,)
  std::vector<const std::vector<int>*> row_blocks;  // (T,)
  std::vector<std::vector<float>> thread_scratch;   // per thread
};

class Model {
 public:
  explicit Model(const std::string& path);

  const ModelConfig& config() const { return cfg_; }
  const GgufFile& file() const { return *file_; }
  // Bytes of every weight read by one decode step (the shared weight stream).
  size_t weight_bytes() const { return weight_bytes_; }

  // Runs items through the model, writing their K/V into the pool and returning
  // logits rows in item order: for each item, n - logits_from rows of n_vocab.
  // logits: (sum over items of (n - logits_from), n_vocab)
  void forward(const std::vector<BatchItem>& items, KvPool& kv, ThreadPool& pool, const Kernels& kern, Workspace& ws,
               std::vector<float>& logits) const;

 private:
  Weight load_weight(const std::string& name, int64_t rows, int64_t cols) const;
  std::vector<float> load_vector(const std::string& name, int64_t n) const;

  std::unique_ptr<GgufFile> file_;
  ModelConfig cfg_;
  Weight tok_embd_;  // (n_vocab, n_embd)
  Weight output_;    // (n_vocab, n_embd); tok_embd_ when tied
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  size_t weight_bytes_ = 0;
};

}  // namespace kvs
