// Counting the host's waits for tensor data. On CUDA, item(), to_f64_vector() and a copy_()
// between the host and a device each wait for everything queued on the device before them; a
// training step should make one (its metrics). The same calls are counted on CPU, so a test on a
// machine without a GPU sees the waits that the same code makes on CUDA.
#pragma once

#include <cstdint>

namespace fsdp {

// Those calls so far, on any thread.
int64_t host_sync_count();

}  // namespace fsdp
