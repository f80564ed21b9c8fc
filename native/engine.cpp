#include "engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.h"
#include "device_forward.h"
#include "kv_transfer.h"
#include "sampling.h"

namespace kvs {

Engine::Engine(const EngineOptions& opt) : opt_(opt) {
  if (opt.max_batch_tokens < 1) {
    throw std::invalid_argument("max_batch_tokens must be at least 1, got " + std::to_string(opt.max_batch_tokens));
  }
  kern_ = opt.isa.empty() ? &active_kernels() : &kernels_for(opt.isa);
  // Only the CPU backend streams the weights from host memory at every step; the others upload them.
  const bool host_weights = opt.backend == "cpu" && opt.huge_pages;
  model_ = std::make_unique<Model>(opt.model_path, host_weights ? Residency::kHugePages : Residency::kMapped,
                                   host_weights ? kern_ : nullptr);
  const ModelConfig& c = model_->config();
  KvGeometry g;
  g.n_layer = c.n_layer;
  g.n_kv_head = c.n_head_kv;
  g.head_dim = c.head_dim;
  g.k_format = kv_format_from_string(opt.kv_k);
  g.v_format = kv_format_from_string(opt.kv_v);
  g.block_tokens = opt.block_tokens;
  g.key_tiles = kern_->key_tiles;
  g.value_tiles = kern_->value_tiles;
  if (c.n_layer_swa == 0) {
    kv_ = std::make_unique<KvPool>(g, opt.kv_budget_bytes, opt.backend == "cpu");
  } else {
    // Two block classes over one budget: global layers keep every position, sliding
    // layers only the window. Prefix sharing is off: sliding blocks leave the window.
    auto budget = std::make_shared<KvBudget>();
    budget->bytes = opt.kv_budget_bytes;
    KvGeometry gs = g;
    gs.n_layer = c.n_layer_swa;
    g.n_layer = c.n_layer - c.n_layer_swa;
    kv_ = std::make_unique<KvPool>(g, budget, opt.backend == "cpu");
    swa_kv_ = std::make_unique<KvPool>(gs, budget, opt.backend == "cpu");
    const size_t one_each = kv_->block_bytes() + swa_kv_->block_bytes();
    if (budget->bytes != 0 && budget->bytes < one_each) {
      throw KvBudgetError("KV budget of " + std::to_string(budget->bytes) +
                          " bytes is smaller than one global and one sliding-window block (" +
                          std::to_string(kv_->block_bytes()) + " + " + std::to_string(swa_kv_->block_bytes()) +
                          " bytes); raise kv_budget_bytes or choose a narrower KV format");
    }
    opt_.prefix_sharing = false;
  }
  pool_ = std::make_unique<ThreadPool>(opt.threads);
  if (opt.backend == "vulkan" || opt.backend == "cpu-ops") {
    if (opt.backend == "cpu-ops" && opt.device != 0) {
      throw std::invalid_argument("backend cpu-ops has one device (0), got device " + std::to_string(opt.device));
    }
    backend_ = opt.backend == "vulkan" ? make_backend("vulkan", opt.device, opt.float_activations)
                                       : make_cpu_backend(opt.float_activations);
    device_ = std::make_unique<DeviceForward>(*model_, *backend_, *kern_);
  } else if (opt.backend != "cpu") {
    throw std::invalid_argument("unknown backend '" + opt.backend + "' (expected cpu, vulkan or cpu-ops)");
  }
  ws_.float_activations = opt.float_activations;
}

Engine::~Engine() = default;

void Engine::run_forward(const std::vector<BatchItem>& items) {
  if (device_) {
    device_->forward(items, *kv_, swa_kv_.get(), logits_);
  } else {
    model_->forward(items, *kv_, swa_kv_.get(), *pool_, *kern_, ws_, logits_);
  }
}

std::vector<float> Engine::last_logits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return logits_;
}

std::string Engine::backend_name() const {
  if (!backend_) return "cpu";
  return opt_.backend == "cpu-ops" ? "cpu-ops" : backend_->name();
}

std::string Engine::dot_path() const {
  if (!backend_) return ws_.float_activations ? "float" : "integer dot";
  return backend_->dot_path();
}

Engine::Sequence& Engine::get(int id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::out_of_range("no sequence with id " + std::to_string(id));
  return it->second;
}

const Engine::Sequence& Engine::get(int id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::out_of_range("no sequence with id " + std::to_string(id));
  return it->second;
}

void Engine::check_tokens(const std::vector<int32_t>& tokens) const {
  const int nv = model_->config().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= nv) {
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(nv) + ")");
    }
  }
}

static void check_sampling(const SamplingParams& sp) {
  if (!std::isfinite(sp.temperature) || sp.temperature < 0.0f) {
    throw std::invalid_argument("temperature must be finite and >= 0");
  }
  if (sp.top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0 disables it)");
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) throw std::invalid_argument("top_p must be in (0, 1]");
  if (!(sp.repetition_penalty > 0.0f) || !std::isfinite(sp.repetition_penalty)) {
    throw std::invalid_argument("repetition_penalty must be positive and finite");
  }
  if (sp.repeat_last_n < 0) throw std::invalid_argument("repeat_last_n must be >= 0");
  if (sp.max_new_tokens < -1) throw std::invalid_argument("max_new_tokens must be >= 0, or -1 for no limit");
}

int Engine::add_sequence(const std::vector<int32_t>& tokens, const SamplingParams& sp, bool generate) {
  std::lock_guard<std::mutex> lock(mu_);
  check_tokens(tokens);
  check_sampling(sp);
  const int n_ctx = model_->config().n_ctx_train;
  if (static_cast<int64_t>(tokens.size()) > n_ctx) {
    throw std::invalid_argument("prompt of " + std::to_string(tokens.size()) + " tokens exceeds the model's " +
                                std::to_string(n_ctx) + "-token context; shorten it");
  }
  if (generate && tokens.empty()) {
    throw std::invalid_argument("a generating sequence needs at least one prompt token");
  }
  Sequence s;
  s.id = next_id_++;
  s.tokens = tokens;
  s.sp = sp;
  s.rng.seed(sp.seed);
  s.generating = generate;
  // A generating sequence computes at least its last prompt token (for its logits).
  if (opt_.prefix_sharing) share_prefix(s, static_cast<int>(tokens.size()) - (generate ? 1 : 0));
  const int id = s.id;
  seqs_.emplace(id, std::move(s));
  return id;
}

std::vector<int32_t> Engine::block_key(const Sequence& s, int i, int parent) const {
  const int bt = kv_->geometry().block_tokens;
  std::vector<int32_t> key;
  key.reserve(bt + 1);
  key.push_back(parent);
  key.insert(key.end(), s.tokens.begin() + static_cast<ptrdiff_t>(i) * bt,
             s.tokens.begin() + static_cast<ptrdiff_t>(i + 1) * bt);
  return key;
}

void Engine::share_prefix(Sequence& s, int limit) {
  const int bt = kv_->geometry().block_tokens;
  int parent = -1;
  for (int i = 0; (i + 1) * bt <= limit; ++i) {
    auto it = prefix_index_.find(block_key(s, i, parent));
    if (it == prefix_index_.end()) break;
    kv_->share(it->second);
    s.blocks.push_back(it->second);
    parent = it->second;
  }
  s.n_past = static_cast<int>(s.blocks.size()) * bt;
  s.published = static_cast<int>(s.blocks.size());
  prefix_tokens_reused_ += static_cast<size_t>(s.n_past);
}

void Engine::publish_blocks(Sequence& s) {
  if (!opt_.prefix_sharing || s.synthetic || s.converted) return;
  const int bt = kv_->geometry().block_tokens;
  for (; s.published < s.n_past / bt; ++s.published) {
    const int i = s.published;
    const int block = s.blocks[i];
    if (indexed_key_.count(block)) continue;  // already indexed (shared from another sequence)
    std::vector<int32_t> key = block_key(s, i, i == 0 ? -1 : s.blocks[i - 1]);
    if (prefix_index_.emplace(key, block).second) indexed_key_.emplace(block, std::move(key));
  }
}

void Engine::release_blocks(Sequence& s) {
  for (int b : s.blocks) {
    if (!kv_->release(b)) continue;
    auto it = indexed_key_.find(b);
    if (it == indexed_key_.end()) continue;
    prefix_index_.erase(it->second);
    indexed_key_.erase(it);
  }
  s.blocks.clear();
  for (int b : s.swa_blocks) {
    if (b >= 0) swa_kv_->release(b);
  }
  s.swa_blocks.clear();
}

void Engine::append(int id, const std::vector<int32_t>& tokens, const SamplingParams& sp, bool generate) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  check_tokens(tokens);
  check_sampling(sp);
  const int n_ctx = model_->config().n_ctx_train;
  if (static_cast<int64_t>(s.tokens.size() + tokens.size()) > n_ctx) {
    throw std::invalid_argument("sequence " + std::to_string(id) + " would hold " +
                                std::to_string(s.tokens.size() + tokens.size()) + " tokens, more than the model's " +
                                std::to_string(n_ctx) + "-token context");
  }
  if (generate && s.tokens.size() + tokens.size() == 0) {
    throw std::invalid_argument("a generating sequence needs at least one token");
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.sp = sp;
  s.rng.seed(sp.seed);
  s.generating = generate;
  s.generated = 0;
  s.finish_reason.clear();
  s.lazy_tail = false;
}

void Engine::finish(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  if (s.generating) {
    s.generating = false;
    s.finish_reason = "finished";
    s.lazy_tail = s.n_past + 1 == static_cast<int>(s.tokens.size());
  }
}

void Engine::free(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  release_blocks(s);
  seqs_.erase(id);
}

bool Engine::ensure_blocks(Sequence& s, int n, int swa_from) {
  const int bt = kv_->geometry().block_tokens;
  const size_t need = static_cast<size_t>((n + bt - 1) / bt);
  const size_t new_global = need > s.blocks.size() ? need - s.blocks.size() : 0;
  if (!swa_kv_) {
    if (new_global == 0) return true;
    if (new_global > kv_->max_blocks() - kv_->blocks_in_use()) return false;
    while (s.blocks.size() < need) s.blocks.push_back(kv_->acquire());
    return true;
  }
  // Sliding blocks for [swa_from, n): those not yet held (-1 or past the table's end).
  const size_t first = static_cast<size_t>(std::max(0, swa_from) / bt);
  size_t new_swa = 0;
  for (size_t i = first; i < need; ++i) new_swa += i >= s.swa_blocks.size() || s.swa_blocks[i] < 0 ? 1 : 0;
  const size_t budget = kv_->budget_bytes();
  const size_t bytes = new_global * kv_->block_bytes() + new_swa * swa_kv_->block_bytes();
  if (budget != 0 && bytes > budget - std::min(budget, kv_->budget_reserved())) return false;
  while (s.blocks.size() < need) s.blocks.push_back(kv_->acquire());
  if (s.swa_blocks.size() < need) s.swa_blocks.resize(need, -1);
  for (size_t i = first; i < need; ++i) {
    if (s.swa_blocks[i] < 0) s.swa_blocks[i] = swa_kv_->acquire();
  }
  return true;
}

void Engine::trim_window(Sequence& s) {
  if (!swa_kv_) return;
  const int bt = kv_->geometry().block_tokens;
  const int keep_from = std::max(0, s.n_past - window() + 1);
  // Block i covers [i*bt, (i+1)*bt): wholly before keep_from when (i+1)*bt <= keep_from.
  for (size_t i = 0; i < s.swa_blocks.size() && static_cast<int>(i + 1) * bt <= keep_from; ++i) {
    if (s.swa_blocks[i] >= 0) {
      swa_kv_->release(s.swa_blocks[i]);
      s.swa_blocks[i] = -1;
    }
  }
}

bool Engine::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, s] : seqs_) {
    if (s.finish_reason == "kv_budget" || s.lazy_tail) continue;
    if (s.generating || s.n_past < static_cast<int>(s.tokens.size())) return true;
  }
  return false;
}

std::vector<std::pair<int, int32_t>> Engine::step() {
  std::lock_guard<std::mutex> lock(mu_);
  const int n_ctx = model_->config().n_ctx_train;
  struct Planned {
    Sequence* s;
    int take;
    bool sample;
  };
  std::vector<Planned> plan;
  int budget = opt_.max_batch_tokens;
  // Decode tokens first (one per generating sequence), then prefill chunks in id order.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& [id, s] : seqs_) {
      if (s.finish_reason == "kv_budget" || s.lazy_tail) continue;  // waits for append / free
      const int pending = static_cast<int>(s.tokens.size()) - s.n_past;
      const bool is_decode = s.generating && pending == 1;
      if (pending <= 0 || (pass == 0) != is_decode) continue;
      const int take = pass == 0 ? 1 : std::min(pending, budget);
      if (take <= 0) break;
      if (!ensure_blocks(s, s.n_past + take)) {
        s.generating = false;
        s.finish_reason = "kv_budget";
        continue;
      }
      budget -= take;
      plan.push_back({&s, take, s.generating && take == pending});
    }
  }
  std::vector<std::pair<int, int32_t>> out;
  if (plan.empty()) return out;
  ScopeTimer step_timer(ws_.timers.on ? &ws_.timers.total_s : nullptr);  // forward and sampling
  if (ws_.timers.on) ++ws_.timers.steps;

  std::vector<BatchItem> items;
  items.reserve(plan.size());
  for (const Planned& p : plan) {
    BatchItem it;
    it.tokens = p.s->tokens.data() + p.s->n_past;
    it.n = p.take;
    it.pos0 = p.s->n_past;
    it.blocks = &p.s->blocks;
    it.swa_blocks = &p.s->swa_blocks;
    it.logits_from = p.sample ? p.take - 1 : p.take;
    items.push_back(it);
  }
  run_forward(items);

  const int nv = model_->config().n_vocab;
  int r = 0;
  for (const Planned& p : plan) {
    Sequence& s = *p.s;
    s.n_past += p.take;
    trim_window(s);
    publish_blocks(s);
    if (!p.sample) continue;
    const int32_t tok = sample(s, logits_.data() + static_cast<size_t>(r) * nv);
    ++r;
    s.tokens.push_back(tok);
    ++s.generated;
    out.emplace_back(s.id, tok);
    if (std::find(s.sp.stop_tokens.begin(), s.sp.stop_tokens.end(), tok) != s.sp.stop_tokens.end()) {
      s.finish_reason = "stop_token";
    } else if (s.sp.max_new_tokens >= 0 && s.generated >= s.sp.max_new_tokens) {
      s.finish_reason = "max_tokens";
    } else if (static_cast<int>(s.tokens.size()) >= n_ctx) {
      s.finish_reason = "context";
    }
    if (!s.finish_reason.empty()) {
      s.generating = false;
      s.lazy_tail = true;
    }
  }
  return out;
}

std::vector<float> Engine::score(int id, const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  check_tokens(tokens);
  const int n_ctx = model_->config().n_ctx_train;
  if (static_cast<int64_t>(s.tokens.size() + tokens.size()) > n_ctx) {
    throw std::invalid_argument("scoring would take sequence " + std::to_string(id) + " past the model's " +
                                std::to_string(n_ctx) + "-token context");
  }
  const size_t old_size = s.tokens.size();
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  // Without sliding layers every block is taken up front; with them, chunk by chunk
  // (the window's blocks are recycled), and a budget failure keeps the chunks done.
  if (!swa_kv_ && !ensure_blocks(s, static_cast<int>(s.tokens.size()))) {
    s.tokens.resize(old_size);
    throw KvBudgetError("KV budget exhausted while scoring sequence " + std::to_string(id) +
                        "; free sequences or raise kv_budget_bytes");
  }
  s.generating = false;
  s.lazy_tail = false;
  const int nv = model_->config().n_vocab;
  std::vector<float> all;
  all.reserve((s.tokens.size() - s.n_past) * static_cast<size_t>(nv));
  while (s.n_past < static_cast<int>(s.tokens.size())) {
    const int take = std::min(opt_.max_batch_tokens, static_cast<int>(s.tokens.size()) - s.n_past);
    if (swa_kv_ && !ensure_blocks(s, s.n_past + take)) {
      s.tokens.resize(std::max(old_size, static_cast<size_t>(s.n_past)));
      throw KvBudgetError("KV budget exhausted while scoring sequence " + std::to_string(id) + " at position " +
                          std::to_string(s.n_past) + "; free sequences or raise kv_budget_bytes");
    }
    ScopeTimer chunk_timer(ws_.timers.on ? &ws_.timers.total_s : nullptr);
    if (ws_.timers.on) ++ws_.timers.steps;
    BatchItem it;
    it.tokens = s.tokens.data() + s.n_past;
    it.n = take;
    it.pos0 = s.n_past;
    it.blocks = &s.blocks;
    it.swa_blocks = &s.swa_blocks;
    it.logits_from = 0;
    run_forward({it});
    all.insert(all.end(), logits_.begin(), logits_.begin() + static_cast<size_t>(take) * nv);
    s.n_past += take;
    trim_window(s);
    publish_blocks(s);
  }
  return all;
}

void Engine::fill_kv(int id, int n, uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  const ModelConfig& c = model_->config();
  if (n < 0 || static_cast<int64_t>(s.tokens.size()) + n > c.n_ctx_train) {
    throw std::invalid_argument("fill_kv: " + std::to_string(n) + " positions do not fit the model's context");
  }
  if (s.n_past != static_cast<int>(s.tokens.size())) {
    throw std::invalid_argument("fill_kv: the sequence has unprocessed tokens");
  }
  // Sliding layers only get the positions the window keeps after the fill.
  const int swa_from = s.n_past + n + 1 - window();
  if (!ensure_blocks(s, s.n_past + n, swa_from)) throw KvBudgetError("fill_kv: KV budget exhausted");
  const KvGeometry& g = kv_->geometry();
  // Values only need a plausible spread (they feed timing and budget checks, never a result), so a
  // cheap approximate normal: the sum of four uniforms on [-sqrt(3), sqrt(3)] has mean 0 and variance 1
  // (Irwin-Hall). std::normal_distribution cost ~50 ns a value: 5 s to fill 8k positions of this model.
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (state == 0) state = 1;  // xorshift never leaves 0
  auto normal = [&state]() {
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) {
      state ^= state >> 12, state ^= state << 25, state ^= state >> 27;  // xorshift64*
      const uint64_t r = state * 0x2545F4914F6CDD1Dull;
      sum += static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // uniform [0, 1), 24 bits
    }
    return (sum - 2.0f) * 1.7320508f;  // 4 uniforms: mean 2, variance 1/3
  };
  std::vector<float> row(c.head_dim);
  for (int p = s.n_past; p < s.n_past + n; ++p) {
    const int slot = p % g.block_tokens;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool swa = !c.layer_swa.empty() && c.layer_swa[l] != 0;
      const int block = swa ? (p < swa_from ? -1 : s.swa_blocks[p / g.block_tokens]) : s.blocks[p / g.block_tokens];
      if (block < 0) continue;  // a sliding position the window has already left
      KvPool& pool = swa ? *swa_kv_ : *kv_;
      const int kl = c.layer_kv_index[l];
      for (int h = 0; h < c.n_head_kv; ++h) {
        for (float& x : row) x = normal();
        // A device pool's rows are written into host copies of its blocks (uploaded below).
        uint8_t* host = device_ ? device_->host_block(pool, swa, block) : nullptr;
        if (host) {
          kv_store_row(g.k_format, row.data(), host + pool.k_row_offset(kl, slot, h), c.head_dim);
        } else {
          pool.store_k_row(block, kl, slot, h, row.data());
        }
        for (float& x : row) x = normal();
        if (host) {
          kv_store_row(g.v_format, row.data(), host + pool.v_row_offset(kl, slot, h), c.head_dim);
        } else {
          pool.store_v_row(block, kl, slot, h, row.data());
        }
      }
    }
  }
  if (device_) device_->flush_blocks();
  s.tokens.insert(s.tokens.end(), n, 0);
  s.n_past += n;
  trim_window(s);
  s.synthetic = true;
}

int32_t Engine::sample(Sequence& s, const float* logits_in) {
  const int nv = model_->config().n_vocab;
  const SamplingParams& sp = s.sp;
  // The logits are copied only when a token mask or the repetition penalty changes them.
  const float* l = logits_in;
  std::vector<float>& penalized = draw_.logits;  // kept between calls: no 192 KB allocation per token
  if (!s.token_mask.empty()) {                   // masked tokens get -inf: never the argmax, probability 0 below
    // A word at a time: a grammar's mask is mostly whole words of disallowed (or allowed) tokens.
    penalized.resize(nv);
    for (int w0 = 0; w0 < nv; w0 += 32) {
      const uint32_t word = s.token_mask[static_cast<size_t>(w0) >> 5];
      const int n = std::min(32, nv - w0);
      if (word == 0u) {
        std::fill_n(penalized.data() + w0, n, -INFINITY);
      } else if (word == 0xFFFFFFFFu) {
        std::copy_n(logits_in + w0, n, penalized.data() + w0);
      } else {
        for (int i = 0; i < n; ++i) penalized[w0 + i] = (word >> i) & 1u ? logits_in[w0 + i] : -INFINITY;
      }
    }
    l = penalized.data();
  }
  if (sp.repetition_penalty != 1.0f && sp.repeat_last_n > 0) {
    // llama.cpp's rule: divide positive logits, multiply negative ones, once per distinct token.
    if (l == logits_in) penalized.assign(logits_in, logits_in + nv);
    std::unordered_set<int32_t> seen;
    const size_t n = s.tokens.size();
    const size_t from = n > static_cast<size_t>(sp.repeat_last_n) ? n - sp.repeat_last_n : 0;
    for (size_t i = from; i < n; ++i) {
      const int32_t t = s.tokens[i];
      if (!seen.insert(t).second) continue;
      penalized[t] = penalized[t] > 0.0f ? penalized[t] / sp.repetition_penalty : penalized[t] * sp.repetition_penalty;
    }
    l = penalized.data();
  }
  return draw_token(l, nv, sp.temperature, sp.top_k, sp.top_p, s.rng, *kern_, draw_);
}

void Engine::set_token_mask(int id, const std::vector<uint32_t>& bits) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence& s = get(id);
  const int nv = model_->config().n_vocab;
  const size_t words = (static_cast<size_t>(nv) + 31) / 32;
  if (bits.size() != words) {
    throw std::invalid_argument("set_token_mask: sequence " + std::to_string(id) + ": the mask has " +
                                std::to_string(bits.size()) + " 32-bit words, expected " + std::to_string(words) +
                                " (one bit per token of the " + std::to_string(nv) + "-token vocabulary)");
  }
  bool any = false;
  for (int t = 0; t < nv && !any; ++t) any = (bits[static_cast<size_t>(t) >> 5] >> (t & 31)) & 1u;
  if (!any) {
    throw std::invalid_argument("set_token_mask: sequence " + std::to_string(id) +
                                ": the mask allows no token of the vocabulary; allow at least one (e.g. a stop token)");
  }
  s.token_mask = bits;
}

void Engine::clear_token_mask(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  get(id).token_mask.clear();
}

SequenceInfo Engine::info(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Sequence& s = get(id);
  SequenceInfo i;
  i.id = s.id;
  i.n_tokens = static_cast<int>(s.tokens.size());
  i.n_past = s.n_past;
  i.generating = s.generating;
  i.generated = s.generated;
  i.finish_reason = s.finish_reason;
  return i;
}

std::vector<int> Engine::sequence_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

std::vector<int32_t> Engine::tokens(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return get(id).tokens;
}

void Engine::set_kv_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_->set_budget(bytes);
}

MemoryStats Engine::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats m;
  m.bytes_per_token = kv_->bytes_per_token();
  m.block_bytes = kv_->block_bytes();
  m.block_tokens = kv_->geometry().block_tokens;
  m.budget_bytes = kv_->budget_bytes();
  m.blocks_in_use = kv_->blocks_in_use();
  m.key_tiles = kv_->k_tiled();
  m.value_tiles = kv_->v_tiled();
  // {block: positions filled}; a shared block counts once.
  std::unordered_map<int, int> filled;
  const int bt = kv_->geometry().block_tokens;
  for (const auto& [id, s] : seqs_) {
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const int n = std::clamp(s.n_past - static_cast<int>(i) * bt, 0, bt);
      int& f = filled[s.blocks[i]];
      f = std::max(f, n);
    }
  }
  for (const auto& [b, n] : filled) {
    m.bytes_used += static_cast<size_t>(n) * kv_->bytes_per_token();
    m.blocks_shared += kv_->holders(b) > 1 ? 1 : 0;
  }
  m.prefix_tokens_reused = prefix_tokens_reused_;
  m.bytes_reserved = kv_->blocks_in_use() * kv_->block_bytes();
  m.bytes_allocated = kv_->blocks_allocated() * kv_->block_bytes();
  if (swa_kv_) {
    // Sliding class: a sequence stores its last min(n_past, W) positions (held blocks are not shared).
    m.sliding_window = window();
    m.swa_bytes_per_token = swa_kv_->bytes_per_token();
    m.swa_block_bytes = swa_kv_->block_bytes();
    m.swa_blocks_in_use = swa_kv_->blocks_in_use();
    m.swa_blocks_allocated = swa_kv_->blocks_allocated();
    for (const auto& [id, s] : seqs_) {
      m.bytes_used += static_cast<size_t>(std::min(s.n_past, window())) * swa_kv_->bytes_per_token();
    }
    m.bytes_reserved += swa_kv_->blocks_in_use() * swa_kv_->block_bytes();
    m.bytes_allocated += swa_kv_->blocks_allocated() * swa_kv_->block_bytes();
  }
  m.weight_bytes = model_->weight_bytes();
  m.weights_huge_pages = model_->file().huge_pages();
  m.weight_tile_bytes = model_->tile_bytes();
  m.weight_tile_types = kern_->weight_tile_types;
  size_t scratch = logits_.capacity() * sizeof(float);
  for (const auto* v : {&ws_.x, &ws_.xn, &ws_.q, &ws_.k, &ws_.v, &ws_.attn, &ws_.ff_gate, &ws_.ff_up, &ws_.logits_in}) {
    scratch += v->capacity() * sizeof(float);
  }
  for (const auto& v : ws_.thread_scratch) scratch += v.capacity() * sizeof(float);
  scratch += ws_.partials.capacity() * sizeof(float) + ws_.xq.capacity() * sizeof(BlockQ8A);
  for (const auto* v : {&ws_.moe_probs, &ws_.moe_weight, &ws_.moe_in, &ws_.moe_gate, &ws_.moe_up, &ws_.moe_out}) {
    scratch += v->capacity() * sizeof(float);
  }
  for (const auto* v : {&ws_.moe_choice, &ws_.moe_row, &ws_.moe_first}) scratch += v->capacity() * sizeof(int);
  m.scratch_bytes = scratch;
  m.sequences = static_cast<int>(seqs_.size());
  return m;
}

void Engine::set_timers(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  ws_.timers.on = on;
}

StepTimers Engine::timers(bool reset) {
  std::lock_guard<std::mutex> lock(mu_);
  const StepTimers t = ws_.timers;
  if (reset) ws_.timers.reset();
  return t;
}

void Engine::reset_timers() {
  std::lock_guard<std::mutex> lock(mu_);
  ws_.timers.reset();
}

// ---- KV snapshots (issue 18; kv_transfer.h) ----

KvSnapshotSource Engine::snapshot_of(const Sequence& s) const {
  if (s.synthetic) {
    throw std::invalid_argument("export_kv: sequence " + std::to_string(s.id) +
                                " holds fill_kv's synthetic positions, whose KV does not match its tokens; "
                                "only sequences built from real tokens can be exported");
  }
  KvSnapshotSource src;
  src.config = &model_->config();
  src.kv = kv_.get();
  src.swa_kv = swa_kv_.get();
  src.tokens = &s.tokens;
  src.n_past = s.n_past;
  src.blocks = &s.blocks;
  src.swa_blocks = &s.swa_blocks;
  src.lazy_tail = s.lazy_tail;
  src.block_bytes = device_block_bytes();
  return src;
}

KvBlockBytes Engine::device_block_bytes() const {
  if (!device_) return {};
  // Host copies of the device blocks (downloaded on first use); flush_blocks() uploads and drops them.
  return [this](bool swa, int block) { return device_->host_block(swa ? *swa_kv_ : *kv_, swa, block); };
}

std::string Engine::export_kv(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string blob;
  try {
    blob = write_kv_snapshot(snapshot_of(get(id)));
  } catch (...) {
    if (device_) device_->flush_blocks();
    throw;
  }
  if (device_) device_->flush_blocks();
  return blob;
}

size_t Engine::kv_export_bytes(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_snapshot_bytes(snapshot_of(get(id)));
}

int Engine::import_kv(const std::string& blob, const SamplingParams& sp, bool generate) {
  return import_kv(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), sp, generate);
}

int Engine::import_kv(const uint8_t* data, size_t n, const SamplingParams& sp, bool generate) {
  check_sampling(sp);
  // Validation (the checksum reads every byte) runs before the lock: the model's config never changes.
  KvSnapshot snap = read_kv_snapshot(data, n, model_->config());
  check_tokens(snap.tokens);
  if (generate && snap.n_past == static_cast<int>(snap.tokens.size())) {
    throw std::invalid_argument("import_kv: every token of the snapshot (" + std::to_string(snap.tokens.size()) +
                                ") has KV, so there is no token to generate from; import with generate=False "
                                "and append the next turn's tokens with generate=True");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const KvGeometry& g = kv_->geometry();
  const bool same_format = snap.k_format == g.k_format && snap.v_format == g.v_format;
  Sequence s;
  s.tokens = std::move(snap.tokens);
  s.sp = sp;
  s.rng.seed(sp.seed);
  // Blocks this engine already holds for the same first tokens are shared, as add_sequence shares them
  // (only when no conversion is needed: the shared rows are then the snapshot's own bytes).
  const size_t reused_before = prefix_tokens_reused_;
  if (opt_.prefix_sharing && same_format) share_prefix(s, snap.n_past);
  const int shared = s.n_past;
  if (!ensure_blocks(s, snap.n_past, snap.swa_from)) {
    const int bt = g.block_tokens;
    const size_t global_blocks = static_cast<size_t>((snap.n_past + bt - 1) / bt) - s.blocks.size();
    release_blocks(s);
    prefix_tokens_reused_ = reused_before;
    throw KvBudgetError("import_kv: the snapshot's " + std::to_string(snap.n_past) + " positions need " +
                        std::to_string(global_blocks) + " more KV blocks of " + std::to_string(kv_->block_bytes()) +
                        " bytes" + (swa_kv_ ? " (and the sliding window's)" : "") + ", more than the budget of " +
                        std::to_string(kv_->budget_bytes()) + " bytes has free (" +
                        std::to_string(kv_->budget_reserved()) +
                        " reserved); free or park sequences, or raise kv_budget_bytes");
  }
  try {
    write_kv_snapshot_rows(snap, model_->config(), *kv_, swa_kv_.get(), s.blocks, s.swa_blocks, shared, *kern_,
                           device_block_bytes());
    if (device_) device_->flush_blocks();
  } catch (...) {
    if (device_) device_->flush_blocks();
    release_blocks(s);
    prefix_tokens_reused_ = reused_before;
    throw;
  }
  s.n_past = snap.n_past;
  trim_window(s);
  s.converted = !same_format;
  s.generating = generate;
  s.lazy_tail = !generate && snap.lazy_tail;
  s.id = next_id_++;
  publish_blocks(s);
  const int id = s.id;
  seqs_.emplace(id, std::move(s));
  return id;
}

}  // namespace kvs
