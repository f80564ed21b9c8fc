// Read bandwidth of this machine as the engine's threads see it: the limit a
// decode step (which must read every weight and its KV once) runs against.
#pragma once

#include <cstddef>

namespace kvs {

// Bytes per second reading a buffer of `bytes` (far larger than the caches, in transparent huge pages
// where the kernel has them) with `threads` threads of the engine's pool; best of `repeats` passes.
double measure_read_bandwidth(int threads, size_t bytes, int repeats);

}  // namespace kvs
