#include "threadpool.h"

#include <stdexcept>

namespace kvs {

// Spin iterations before a worker sleeps: long enough to bridge the gap between
// the loops of one step (~microseconds), short enough not to burn an idle core.
constexpr int kSpinIterations = 20000;

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

void ThreadPool::run_slice(int index) {
  const int64_t per = (n_ + n_threads_ - 1) / n_threads_;
  const int64_t begin = std::min<int64_t>(n_, per * index);
  const int64_t end = std::min<int64_t>(n_, begin + per);
  if (begin < end) {
    try {
      (*fn_)(index, begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
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
    run_slice(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, 0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  run_slice(0);
  while (pending_.load(std::memory_order_acquire) != 0) {
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kvs
