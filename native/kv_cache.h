// Paged KV cache: a pool of fixed-size blocks and per-sequence block tables.
//
// One block holds block_tokens consecutive positions of one sequence for every
// layer, K and V. Byte layout of a block on its own (a device pool's blocks, a
// host copy of one, k_row_offset / v_row_offset):
//   [layer][K | V][kv_head][slot (block_tokens)] rows of kv_row_bytes(format, head_dim)
// so the rows one attention task reads (one layer, one kv head) are contiguous.
// Host blocks live in slabs of N blocks laid out run by run (k_row / v_row):
//   [layer][K | V][kv_head][block of the slab (N)][slot (block_tokens)]
// so the runs of consecutive blocks of one (layer, kv head) are adjacent: a
// sequence whose blocks were taken one after another (a prefill, a long
// decode) reads its context as one stream per (layer, kv head) for the
// hardware prefetcher, not one ~1 KB run per block.
// NOTE: block tables are append-only while a sequence lives. A full block may
// be held by several sequences whose histories share that prefix (reference
// counted, never written again); it returns to the free list when its last
// holder is freed.
// Models with sliding-window layers (gemma3) use two pools of the same
// block_tokens: one for the global layers (every position) and one for the
// sliding layers (only the window; the engine releases blocks that fall out of
// it). The two share one byte budget (KvBudget). A pool may hold zero layers
// (a model whose layers are all sliding): its blocks are then empty and free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kv_format.h"

namespace kvs {

struct KvGeometry {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  KvFormat k_format = KvFormat::F16;
  KvFormat v_format = KvFormat::F16;
  int block_tokens = 16;
  // Store q8_0 / q4_0 keys as 16-row tiles (kv_format.h) where the pool can: host storage and
  // block_tokens a multiple of 16 (KvPool::k_tiled). The engine asks for it when its kernels have a
  // tile body (Kernels::key_tiles).
  bool key_tiles = false;
  // The same for q8_0 / q4_0 values, as value tiles (KvPool::v_tiled, Kernels::value_tiles).
  bool value_tiles = false;
};

// A byte budget shared by the pools of one engine. bytes == 0: no budget.
struct KvBudget {
  size_t bytes = 0;
  size_t reserved = 0;  // blocks held in every pool sharing it x their block bytes
};

// Raised when a block would take the pool past its byte budget.
class KvBudgetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class KvPool {
 public:
  // budget_bytes == 0 means no budget. host_storage false: the pool keeps block
  // ids, holders and byte accounting only, and its blocks' bytes live elsewhere
  // (a device Buffer laid out as blocks_allocated() blocks of block_bytes(), block
  // b at b * block_bytes(): device_forward.h); k_row / v_row must not be used then.
  KvPool(const KvGeometry& g, size_t budget_bytes, bool host_storage = true);
  // A pool drawing on a budget shared with other pools (checked by the caller
  // against one block of each pool).
  KvPool(const KvGeometry& g, std::shared_ptr<KvBudget> shared, bool host_storage = true);

  const KvGeometry& geometry() const { return g_; }
  size_t k_row_bytes() const { return k_row_; }
  size_t v_row_bytes() const { return v_row_; }
  // n_layer * n_kv_head * (k_row + v_row)
  size_t bytes_per_token() const { return bytes_per_token_; }
  // block_tokens * bytes_per_token
  size_t block_bytes() const { return block_bytes_; }
  size_t budget_bytes() const { return budget_->bytes; }
  // Bytes held in every pool sharing this pool's budget.
  size_t budget_reserved() const { return budget_->reserved; }
  // Moves the budget (a re-plan grew or shrank this worker's reservations). Blocks
  // already allocated stay allocated; throws KvBudgetError below the blocks in use.
  void set_budget(size_t budget_bytes);
  // Blocks this pool could hold given what the pools sharing its budget hold
  // (SIZE_MAX without a budget); for a pool alone, budget / block_bytes.
  size_t max_blocks() const;

  // Takes a block from the free list or allocates one; throws KvBudgetError past the budget.
  int acquire();
  // Adds a holder to a block in use (prefix sharing).
  void share(int block);
  // Drops one holder; the block is free when none is left. True if it was freed.
  bool release(int block);
  int holders(int block) const { return refs_.at(block); }

  size_t blocks_in_use() const { return in_use_; }
  size_t blocks_allocated() const { return blocks_.size(); }

  bool host_storage() const { return host_storage_; }
  // Byte offsets inside one block: of a layer's K part and V part, and of one row.
  size_t k_part_offset(int layer) const { return static_cast<size_t>(layer) * layer_bytes_; }
  size_t v_part_offset(int layer) const { return static_cast<size_t>(layer) * layer_bytes_ + k_part_; }
  size_t k_row_offset(int layer, int slot, int head) const {
    return k_part_offset(layer) + (static_cast<size_t>(head) * g_.block_tokens + slot) * k_row_;
  }
  size_t v_row_offset(int layer, int slot, int head) const {
    return v_part_offset(layer) + (static_cast<size_t>(head) * g_.block_tokens + slot) * v_row_;
  }

  // Whether this pool's K runs are tiles: each 16 slots from a multiple of 16 are one key tile
  // (kv_format.h) of 16 * k_row_bytes bytes. Only for host storage (device pools hold rows).
  bool k_tiled() const { return k_tiled_; }
  // The same for V runs and value tiles.
  bool v_tiled() const { return v_tiled_; }
  // The K (part 0) or V (part 1) row of one slot of a host block, encoded from src / copied in / copied
  // out in kv_row_bytes layout, whatever the pool's layout.
  void store_row(int part, int block, int layer, int slot, int head, const float* src) const;
  void put_row(int part, int block, int layer, int slot, int head, const void* row) const;
  void get_row(int part, int block, int layer, int slot, int head, void* row) const;
  void store_k_row(int block, int layer, int slot, int head, const float* src) const {
    store_row(0, block, layer, slot, head, src);
  }
  void store_v_row(int block, int layer, int slot, int head, const float* src) const {
    store_row(1, block, layer, slot, head, src);
  }

  // A host block's rows (slab layout above); consecutive slots are k_row_bytes apart. On a tiled
  // pool k_row (v_row) is only a row for a slot that opens a tile (a multiple of 16): that tile's start.
  uint8_t* k_row(int block, int layer, int slot, int head) const {
    return blocks_[block].k + layer * slab_layer_ + (static_cast<size_t>(head) * slab_run_ + slot) * k_row_;
  }
  uint8_t* v_row(int block, int layer, int slot, int head) const {
    return blocks_[block].v + layer * slab_layer_ + (static_cast<size_t>(head) * slab_run_ + slot) * v_row_;
  }

 private:
  void init();

  KvGeometry g_;
  std::shared_ptr<KvBudget> budget_;
  bool host_storage_ = true;
  bool k_tiled_ = false;
  bool v_tiled_ = false;
  size_t k_row_, v_row_;
  size_t k_part_;       // bytes of the K part of one layer in a block
  size_t layer_bytes_;  // bytes of one layer (K and V) in a block
  size_t bytes_per_token_;
  size_t block_bytes_;
  // Host blocks live in slabs of slab_blocks_ blocks (layout above), 2 MiB-aligned and advised for
  // transparent huge pages: a decode step reads one ~1 KB run per (block, layer, kv head), so with 4 KiB
  // pages every run of a long context was a TLB miss (kv_cache.cpp, acquire).
  size_t slab_blocks_ = 1;
  size_t slab_bytes_ = 0;
  size_t slab_layer_ = 0;  // bytes of one layer (K and V of every block) in a slab
  size_t slab_run_ = 0;    // rows of one (layer, K | V, kv head) in a slab: slab_blocks_ * block_tokens
  struct HostRows {
    uint8_t* k;  // slot 0 of layer 0, kv head 0 of this block's K runs (nullptr: device storage)
    uint8_t* v;  // the same for V
  };
  std::vector<std::shared_ptr<uint8_t>> slabs_;
  size_t slab_used_ = 0;          // blocks of the current slab handed out
  std::vector<HostRows> blocks_;  // every block ever allocated
  std::vector<int> free_;         // ids of blocks not held by a sequence
  std::vector<int> refs_;         // {block: sequences holding it}
  size_t in_use_ = 0;
};

}  // namespace kvs
