#include "kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "huge_pages.h"

namespace kvs {

namespace {

constexpr size_t kSlabTarget = size_t{8} << 20;  // blocks per slab: as many as fit in ~8 MiB, at least one

}  // namespace

KvPool::KvPool(const KvGeometry& g, size_t budget_bytes, bool host_storage)
    : g_(g), budget_(std::make_shared<KvBudget>()), host_storage_(host_storage) {
  budget_->bytes = budget_bytes;
  if (g.n_layer <= 0) throw std::invalid_argument("KvPool: layers must be positive");
  init();
  if (budget_->bytes != 0 && budget_->bytes < block_bytes_) {
    throw KvBudgetError("KV budget of " + std::to_string(budget_->bytes) + " bytes is smaller than one block (" +
                        std::to_string(block_bytes_) + " bytes = " + std::to_string(g.block_tokens) + " tokens x " +
                        std::to_string(bytes_per_token_) +
                        " bytes per token); raise kv_budget_bytes or choose a narrower KV format");
  }
}

KvPool::KvPool(const KvGeometry& g, std::shared_ptr<KvBudget> shared, bool host_storage)
    : g_(g), budget_(std::move(shared)), host_storage_(host_storage) {
  if (budget_ == nullptr) throw std::invalid_argument("KvPool: the shared budget is null");
  if (g.n_layer < 0) throw std::invalid_argument("KvPool: layers must be >= 0");
  init();
}

void KvPool::init() {
  const KvGeometry& g = g_;
  if (g.n_kv_head <= 0 || g.head_dim <= 0) {
    throw std::invalid_argument("KvPool: kv heads and head_dim must be positive");
  }
  // The attention kernels keep one block of scores per query head on the stack.
  if (g.block_tokens <= 0 || g.block_tokens > 64) {
    throw std::invalid_argument("block_tokens must be between 1 and 64, got " + std::to_string(g.block_tokens));
  }
  k_tiled_ = g.key_tiles && host_storage_ && kv_format_tiles(g.k_format) && g.block_tokens % kKeyTileRows == 0;
  v_tiled_ = g.value_tiles && host_storage_ && kv_format_tiles(g.v_format) && g.block_tokens % kKeyTileRows == 0;
  k_row_ = kv_row_bytes(g.k_format, g.head_dim);
  v_row_ = kv_row_bytes(g.v_format, g.head_dim);
  k_part_ = static_cast<size_t>(g.block_tokens) * g.n_kv_head * k_row_;
  layer_bytes_ = k_part_ + static_cast<size_t>(g.block_tokens) * g.n_kv_head * v_row_;
  bytes_per_token_ = static_cast<size_t>(g.n_layer) * g.n_kv_head * (k_row_ + v_row_);
  block_bytes_ = bytes_per_token_ * g.block_tokens;
  if (block_bytes_ != 0) {
    slab_bytes_ = (std::max(size_t{1}, kSlabTarget / block_bytes_) * block_bytes_ + kHugePageBytes - 1) /
                  kHugePageBytes * kHugePageBytes;
    slab_blocks_ = slab_bytes_ / block_bytes_;
  }
  slab_layer_ = slab_blocks_ * layer_bytes_;
  slab_run_ = slab_blocks_ * static_cast<size_t>(g.block_tokens);
}

void KvPool::set_budget(size_t budget_bytes) {
  if (budget_bytes != 0 && budget_bytes < budget_->reserved) {
    if (budget_->reserved == in_use_ * block_bytes_) {  // this pool holds everything (the usual case)
      throw KvBudgetError("KV budget of " + std::to_string(budget_bytes) + " bytes is below the " +
                          std::to_string(in_use_) + " blocks of " + std::to_string(block_bytes_) +
                          " bytes in use; free sequences first");
    }
    throw KvBudgetError("KV budget of " + std::to_string(budget_bytes) + " bytes is below the " +
                        std::to_string(budget_->reserved) + " bytes of KV blocks in use; free sequences first");
  }
  budget_->bytes = budget_bytes;
}

size_t KvPool::max_blocks() const {
  if (budget_->bytes == 0 || block_bytes_ == 0) return SIZE_MAX;
  return in_use_ + (budget_->bytes - std::min(budget_->bytes, budget_->reserved)) / block_bytes_;
}

int KvPool::acquire() {
  if (budget_->bytes != 0 && budget_->reserved + block_bytes_ > budget_->bytes) {
    throw KvBudgetError("KV budget exhausted: " + std::to_string(in_use_) + " blocks of " +
                        std::to_string(block_bytes_) + " bytes in use, budget " + std::to_string(budget_->bytes) +
                        " bytes; free a sequence, raise kv_budget_bytes or choose a narrower KV format");
  }
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    HostRows rows{nullptr, nullptr};
    if (host_storage_ && block_bytes_ != 0) {
      if (slabs_.empty() || slab_used_ == slab_blocks_) {
        slabs_.push_back(map_huge_pages(slab_bytes_));
        slab_used_ = 0;
      }
      uint8_t* slab = slabs_.back().get();
      const size_t run0 = slab_used_ * static_cast<size_t>(g_.block_tokens);  // this block's first row in a run
      rows.k = slab + run0 * k_row_;
      rows.v = slab + slab_blocks_ * k_part_ + run0 * v_row_;
      ++slab_used_;
    }
    blocks_.push_back(rows);
    refs_.push_back(0);
    id = static_cast<int>(blocks_.size() - 1);
  }
  refs_[id] = 1;
  ++in_use_;
  budget_->reserved += block_bytes_;
  return id;
}

void KvPool::share(int block) {
  if (block < 0 || static_cast<size_t>(block) >= blocks_.size() || refs_[block] == 0) {
    throw std::invalid_argument("KvPool::share: block " + std::to_string(block) + " is not in use");
  }
  ++refs_[block];
}

bool KvPool::release(int block) {
  if (block < 0 || static_cast<size_t>(block) >= blocks_.size() || refs_[block] == 0) {
    throw std::invalid_argument("KvPool::release: block " + std::to_string(block) + " is not in use");
  }
  if (--refs_[block] > 0) return false;
  free_.push_back(block);
  --in_use_;
  budget_->reserved -= block_bytes_;
  return true;
}

void KvPool::put_row(int part, int block, int layer, int slot, int head, const void* row) const {
  uint8_t* run = part == 0 ? k_row(block, layer, 0, head) : v_row(block, layer, 0, head);
  const size_t rb = part == 0 ? k_row_ : v_row_;
  if (!(part == 0 ? k_tiled_ : v_tiled_)) {
    std::memcpy(run + slot * rb, row, rb);
    return;
  }
  const int first = slot / kKeyTileRows * kKeyTileRows;
  kv_tile_put_row(part == 0 ? g_.k_format : g_.v_format, part == 0 ? KvTile::Keys : KvTile::Values, row,
                  run + first * rb, slot - first, g_.head_dim);
}

void KvPool::get_row(int part, int block, int layer, int slot, int head, void* row) const {
  const uint8_t* run = part == 0 ? k_row(block, layer, 0, head) : v_row(block, layer, 0, head);
  const size_t rb = part == 0 ? k_row_ : v_row_;
  if (!(part == 0 ? k_tiled_ : v_tiled_)) {
    std::memcpy(row, run + slot * rb, rb);
    return;
  }
  const int first = slot / kKeyTileRows * kKeyTileRows;
  kv_tile_get_row(part == 0 ? g_.k_format : g_.v_format, part == 0 ? KvTile::Keys : KvTile::Values, run + first * rb,
                  slot - first, row, g_.head_dim);
}

void KvPool::store_row(int part, int block, int layer, int slot, int head, const float* src) const {
  const KvFormat f = part == 0 ? g_.k_format : g_.v_format;
  const size_t rb = part == 0 ? k_row_ : v_row_;
  if (!(part == 0 ? k_tiled_ : v_tiled_)) {
    kv_store_row(f, src, part == 0 ? k_row(block, layer, slot, head) : v_row(block, layer, slot, head), g_.head_dim);
    return;
  }
  uint8_t local[2048];  // a q8_0 row of 1920 dims; wider heads take the heap
  std::vector<uint8_t> wide;
  uint8_t* enc = local;
  if (rb > sizeof local) {
    wide.resize(rb);
    enc = wide.data();
  }
  kv_store_row(f, src, enc, g_.head_dim);
  put_row(part, block, layer, slot, head, enc);
}

}  // namespace kvs
