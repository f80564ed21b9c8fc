// Sequences, chunked prefill, batched decode steps and sampling over one Model
// and one KV pool. Thread-safe: every public call takes the engine's mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.h"
#include "model.h"
#include "sampling.h"
#include "threadpool.h"

namespace kvs {

struct KvSnapshotSource;  // kv_transfer.h
class Backend;            // backend/backend.h
class DeviceForward;      // device_forward.h

struct EngineOptions {
  std::string model_path;
  std::string kv_k = "f16";
  std::string kv_v = "f16";
  size_t kv_budget_bytes = 0;  // 0: no budget
  int threads = 2;
  int block_tokens = 16;           // positions per KV block
  int max_batch_tokens = 256;      // tokens (decode + prefill chunks) per step
  std::string isa;                 // "" = best available (or $KVSWARM_ISA)
  bool float_activations = false;  // see Workspace::float_activations
  // A new sequence whose first full blocks of tokens match blocks another live
  // sequence has computed holds those blocks instead of recomputing and
  // storing them again (a shared system prompt costs its KV once).
  // Ignored (off) for models with sliding-window layers: their sliding blocks
  // leave the window and are released, so a block table is not a prefix.
  bool prefix_sharing = true;
  // Where the forward runs (issue 16): "cpu" (model.cpp, the kernels/ table), "vulkan" (device_forward.cpp
  // over the Vulkan backend: weights, activations and the KV pool's bytes on the device; sampling on the
  // host), or "cpu-ops" (device_forward.cpp over the CPU backend's ops: the reference for vulkan, slow;
  // with float_activations its matmuls are float32 like the shaders').
  std::string backend = "cpu";
  int device = 0;  // vulkan: the device index (vulkan_devices())
  // The CPU backend's weights in transparent huge pages where the host allows (gguf.h, Residency),
  // their Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K matrices packed as 16-row tiles where the kernels have a tile body
  // (quant.h); false keeps the file's map (its pages shared with other processes that map the same
  // file) and the rows.
  bool huge_pages = true;
};

struct SamplingParams {
  float temperature = 0.0f;         // <= 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float repetition_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;           // window for the repetition penalty
  uint64_t seed = 0;
  int max_new_tokens = -1;           // per turn; -1: until a stop token or the context ends
  std::vector<int32_t> stop_tokens;  // end the turn when sampled (the token is kept)
};

// Two block classes when the model has sliding-window layers (gemma3): the
// global class (bytes_per_token, block_bytes, blocks_in_use: the layers that
// keep every position) and the sliding class (swa_*: the window's layers, at
// most about window positions per sequence). Without sliding layers the swa_*
// fields are 0 and every other field means what it always did. The byte totals
// (budget, reserved, used, allocated) cover both classes.
struct MemoryStats {
  size_t bytes_per_token = 0;  // global class
  size_t block_bytes = 0;      // global class
  int block_tokens = 0;        // both classes
  size_t budget_bytes = 0;
  size_t bytes_reserved = 0;        // blocks held by sequences x block bytes
  size_t bytes_used = 0;            // positions stored x bytes per token (a shared position counts once)
  size_t bytes_allocated = 0;       // blocks ever allocated (held + free list) x block bytes
  size_t blocks_in_use = 0;         // distinct global blocks held (a shared block counts once)
  int sliding_window = 0;           // W of the sliding layers; 0: none
  size_t swa_bytes_per_token = 0;   // sliding class
  size_t swa_block_bytes = 0;       // sliding class
  size_t swa_blocks_in_use = 0;     // sliding blocks held
  size_t swa_blocks_allocated = 0;  // sliding blocks ever allocated
  size_t blocks_shared = 0;         // blocks held by more than one sequence
  size_t prefix_tokens_reused = 0;  // positions taken from shared blocks instead of computed, since start
  size_t weight_bytes = 0;
  size_t scratch_bytes = 0;  // activations, logits and per-thread scratch
  int sequences = 0;
  bool key_tiles = false;           // keys stored as 16-row tiles (kv_format.h)
  bool value_tiles = false;         // values stored as 16-row value tiles
  bool weights_huge_pages = false;  // the model's bytes in a huge-page copy (gguf.h, Residency)
  size_t weight_tile_bytes = 0;     // of them, the weights packed as 16-row tiles (quant.h)
  uint64_t weight_tile_types = 0;   // the types the kernels serve as tiles (Kernels::weight_tile_types)
};

struct SequenceInfo {
  int id = 0;
  int n_tokens = 0;  // history length
  int n_past = 0;    // positions with KV
  bool generating = false;
  int generated = 0;          // tokens sampled this turn
  std::string finish_reason;  // "", "stop_token", "max_tokens", "context", "kv_budget", "finished"
};

class Engine {
 public:
  explicit Engine(const EngineOptions& opt);
  ~Engine();

  const ModelConfig& config() const { return model_->config(); }
  const Model& model() const { return *model_; }
  std::string isa() const { return kern_->name; }
  // Where the forward runs: "cpu", "cpu-ops" or "vulkan:<device name>" (EngineOptions.backend).
  std::string backend_name() const;
  // How quantized weights are multiplied: "integer dot" (8-bit activation blocks) or "float" (float_activations,
  // or a Vulkan device without shaderIntegerDotProduct, or KVSWARM_VULKAN_INTDOT=0); Backend::dot_path.
  std::string dot_path() const;
  // The logits rows of the last forward: after step(), one row of n_vocab per pair it returned, in that
  // order; after score(), its last chunk's. (R, n_vocab) row-major.
  std::vector<float> last_logits() const;
  const EngineOptions& options() const { return opt_; }

  // New sequence with its first tokens queued for prefill. When `generate`, it
  // samples after the prefill and each step until a stop condition.
  int add_sequence(const std::vector<int32_t>& tokens, const SamplingParams& sp, bool generate);
  // Queues a new turn (KV of the history is kept) and (re)starts generation.
  void append(int id, const std::vector<int32_t>& tokens, const SamplingParams& sp, bool generate);
  // Stops generating (KV kept); the sequence can be extended later.
  void finish(int id);
  void free(int id);

  // One step: every generating sequence with a sampled token advances by one
  // position; queued prompt tokens are prefilled in chunks within
  // max_batch_tokens. Returns (id, sampled token) pairs in sequence id order.
  std::vector<std::pair<int, int32_t>> step();
  // True while some sequence has queued tokens or is generating.
  bool busy() const;

  // Feeds the sequence's queued tokens followed by `tokens` and returns the
  // logits after each of them: (n_queued + tokens.size(), n_vocab), row-major.
  std::vector<float> score(int id, const std::vector<int32_t>& tokens);

  // Calibration aid: appends n synthetic positions (token 0) whose K/V rows are
  // random unit-variance vectors stored in the pool's formats, without running the
  // model. Attention cost does not depend on the values, so benchmarks and
  // calibration can reach long contexts without a long prefill.
  void fill_kv(int id, int n, uint64_t seed);

  SequenceInfo info(int id) const;
  std::vector<int> sequence_ids() const;
  std::vector<int32_t> tokens(int id) const;
  MemoryStats memory() const;
  // See KvPool::set_budget.
  void set_kv_budget(size_t bytes);

  // Constrained decoding: the tokens sequence `id` may sample next, one bit per
  // token id (bit t % 32 of bits[t / 32]; ceil(n_vocab / 32) words). A masked
  // token is never sampled (its logit is -inf before the repetition penalty,
  // temperature, top-k and top-p); stop tokens still end the turn when sampled.
  // The mask stays until replaced or cleared (a caller sets the next one after
  // each sampled token). Throws if the length is wrong or no token is allowed.
  void set_token_mask(int id, const std::vector<uint32_t>& bits);
  void clear_token_mask(int id);

  // Roofline timers (see StepTimers in model.h): off by default, switched at run
  // time. timers() returns the sums since the last reset and, with reset, starts
  // new ones; reset_timers() only clears them.
  void set_timers(bool on);
  StepTimers timers(bool reset = true);
  void reset_timers();

  // KV snapshots (issue 18; the blob format is in kv_transfer.h). export_kv: the
  // sequence's tokens and K/V rows, in this pool's formats and in position order;
  // throws for a sequence holding fill_kv's synthetic rows. kv_export_bytes: the
  // blob's size, without building it. import_kv: a new sequence whose KV is the
  // snapshot's (validated against this model; rows converted when this pool's
  // formats differ; KvBudgetError, holding nothing, when the blocks do not fit).
  // Tokens without KV are queued as add_sequence queues them; a lazy tail stays
  // lazy unless `generate`, which continues generation as add_sequence(...,
  // true) would (it needs a token without KV, as a generating add_sequence does).
  std::string export_kv(int id) const;
  size_t kv_export_bytes(int id) const;
  int import_kv(const std::string& blob, const SamplingParams& sp, bool generate);
  int import_kv(const uint8_t* data, size_t n, const SamplingParams& sp, bool generate);

 private:
  struct Sequence {
    int id = 0;
    std::vector<int32_t> tokens;  // full history: prompt, turns and sampled tokens
    int n_past = 0;               // tokens[0..n_past) have KV
    std::vector<int> blocks;      // block table
    // Sliding layers' block table (models with sliding layers): indexed like
    // blocks; -1 for blocks released once wholly before the window.
    // NOTE: covers [max(0, n_past - W + 1), n_past) between steps.
    std::vector<int> swa_blocks;
    SamplingParams sp;
    std::mt19937_64 rng;
    bool generating = false;
    int generated = 0;
    std::string finish_reason;
    // The last token was sampled after the turn ended; its KV is written with the
    // next turn's prefill instead of by an extra step now.
    bool lazy_tail = false;
    int published = 0;       // blocks [0, published) are in the prefix index or never will be
    bool synthetic = false;  // holds fill_kv positions, whose KV does not match its tokens
    bool converted = false;  // KV imported from another format (import_kv): never published for sharing

    // (ceil(n_vocab / 32),) the tokens it may sample next; empty: all (set_token_mask)
    std::vector<uint32_t> token_mask;
  };

  Sequence& get(int id);
  const Sequence& get(int id) const;
  void check_tokens(const std::vector<int32_t>& tokens) const;
  // Grows the block table to cover n positions and the sliding table to cover
  // [swa_from, n) (clipped at 0); false (blocks unchanged) if the budget is hit.
  bool ensure_blocks(Sequence& s, int n, int swa_from);
  bool ensure_blocks(Sequence& s, int n) { return ensure_blocks(s, n, s.n_past + 1 - window()); }
  // Releases the sliding blocks wholly before max(0, s.n_past - W + 1).
  void trim_window(Sequence& s);
  int window() const { return model_->config().sliding_window; }
  int32_t sample(Sequence& s, const float* logits);
  // Prefix index key of block i of s: [previous block id or -1, the block's tokens].
  std::vector<int32_t> block_key(const Sequence& s, int i, int parent) const;
  // Holds the longest run of indexed blocks matching s's first tokens (at most `limit` positions).
  void share_prefix(Sequence& s, int limit);
  // Indexes s's newly completed blocks so later sequences can share them.
  void publish_blocks(Sequence& s);
  void release_blocks(Sequence& s);
  // What export_kv reads of s (kv_transfer.h).
  KvSnapshotSource snapshot_of(const Sequence& s) const;
  // Host bytes of a pool block for export_kv / import_kv: empty (the pools' own storage) on the CPU
  // forward; host copies of the device blocks otherwise (flushed by the caller).
  std::function<uint8_t*(bool swa, int block)> device_block_bytes() const;

  EngineOptions opt_;
  const Kernels* kern_;
  DrawScratch draw_;  // the sampler's buffers (step holds mu_ while it samples)
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvPool> kv_;      // global layers (every layer for most models)
  std::unique_ptr<KvPool> swa_kv_;  // sliding-window layers; null without them
  std::unique_ptr<ThreadPool> pool_;
  // backend != "cpu": the device and the forward on it (the KvPools then keep only ids and accounting).
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceForward> device_;
  // Runs the forward where EngineOptions.backend says, into logits_.
  void run_forward(const std::vector<BatchItem>& items);
  Workspace ws_;
  std::vector<float> logits_;
  std::map<int, Sequence> seqs_;                      // {id: sequence}, ordered so steps are deterministic
  std::map<std::vector<int32_t>, int> prefix_index_;  // {block key: block id}
  std::map<int, std::vector<int32_t>> indexed_key_;   // {block id: its key}, to unindex on free
  size_t prefix_tokens_reused_ = 0;
  int next_id_ = 1;
  mutable std::mutex mu_;
};

}  // namespace kvs
