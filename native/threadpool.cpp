#include "threadpool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvs {

// Spin iterations before a worker sleeps: long enough to bridge the gap between
// the loops of one step (~microseconds), short enough not to burn an idle core.
// The caller waiting for the last chunks spins as long, then yields its core
// (the thread it waits for may be queued behind it on the same core).
constexpr int kSpinIterations = 20000;

// Chunks per thread in one loop. With k chunks per thread, a thread that falls
// behind (descheduled, or woken late from sleep) holds back at most one chunk,
// 1/(k * threads) of the loop, while the others take the rest. Taking a chunk
// costs two atomic operations on shared cache lines (~0.1 us); the smallest
// loops we split (a decode step's QKV matmul: 120 tiles of 8 rows, ~5 us of
// work per thread) stay well above that at k = 4, and a step's ~150 loops then
// add ~150 * 8 chunk hand-outs, well under 1% of a ~10 ms step.
constexpr int64_t kChunksPerThread = 4;

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1 || n_threads > 256) {
    throw std::invalid_argument("threads must be between 1 and 256, got " + std::to_string(n_threads));
  }
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(int index) {
  for (;;) {
    const int64_t left = chunks_left_.fetch_sub(1, std::memory_order_acquire);
    if (left <= 0) return;
    // The chunk is ours: the job cannot end before we count it done, so its fields hold still.
    const int64_t begin = (n_chunks_ - left) * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    try {
      (*fn_)(index, begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    chunks_done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) ++spins;
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    run_chunks(index);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, 0, n);
    return;
  }
  const int64_t target_chunks = kChunksPerThread * n_threads_;
  fn_ = &fn;
  n_ = n;
  chunk_ = std::max<int64_t>(1, (n + target_chunks - 1) / target_chunks);
  n_chunks_ = (n + chunk_ - 1) / chunk_;
  error_ = nullptr;
  chunks_done_.store(0, std::memory_order_relaxed);
  chunks_left_.store(n_chunks_, std::memory_order_release);  // publishes the job
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  run_chunks(0);
  // Only chunks already taken by workers are left; wait for them, not for workers that never woke.
  int spins = 0;
  while (chunks_done_.load(std::memory_order_acquire) != n_chunks_) {
    if (spins < kSpinIterations) {
      ++spins;
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kvs
