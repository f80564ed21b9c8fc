// Persistent worker threads for data-parallel loops. Created once per engine;
// a step never creates threads. Workers spin briefly on a generation counter
// (a decode step issues ~150 short loops) and then sleep on a condition variable.
//
// Work is handed out in chunks from a shared counter (dynamic scheduling), and
// the caller takes chunks too: a thread that is descheduled, or wakes late,
// simply takes fewer chunks instead of stalling the loop for everyone.
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

  // Runs fn(thread_index, begin, end) over contiguous chunks that cover [0, n)
  // exactly once (the caller is thread 0). Which thread runs which chunk, and
  // where the chunks are cut, vary from call to call: fn must give the same
  // result for any split. thread_index is the executing thread (for per-thread
  // scratch); one thread runs its chunks one after another. Rethrows the first
  // exception once every chunk has run.
  void parallel_for(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  void run_chunks(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};

  // Current job. NOTE: a thread reads these fields only after taking a chunk
  // from chunks_left_ (whose release store publishes them), and the caller
  // rewrites them only after every chunk of the job is counted in chunks_done_;
  // so a worker that wakes late for an old job can never see a half-written one.
  const std::function<void(int, int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;     // elements per chunk (the last chunk may be shorter)
  int64_t n_chunks_ = 0;  // ceil(n_ / chunk_)
  std::exception_ptr error_;
  std::mutex error_mu_;
  // Chunks not yet taken; a thread takes chunk n_chunks_ - left with fetch_sub.
  // It may go below 0 (late takers find nothing); the next job's store resets it.
  alignas(64) std::atomic<int64_t> chunks_left_{0};
  alignas(64) std::atomic<int64_t> chunks_done_{0};  // chunks finished (run or thrown)
};

}  // namespace kvs
