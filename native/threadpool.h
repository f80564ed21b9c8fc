// Persistent worker threads for data-parallel loops. Created once per engine;
// a step never creates threads. Workers spin briefly on a generation counter
// (a decode step issues ~150 short loops) and then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvs {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, begin, end) over [0, n) split into contiguous ranges,
  // one per thread (the caller is thread 0). Rethrows the first exception.
  void parallel_for(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  void run_slice(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  // Current job (valid while pending_ > 0).
  const std::function<void(int, int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::exception_ptr error_;
  std::mutex error_mu_;
};

}  // namespace kvs
